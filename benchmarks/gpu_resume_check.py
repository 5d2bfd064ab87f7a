"""GPU check of exact resume (docs/design/resume.md#in-the-code; docs/integrations.md): on a CUDA device, does a
run resumed from a mado checkpoint end with the weights of an uninterrupted one, byte for byte?

1. ``mado_tracking.torch``: an MLP with dropout (so the CUDA generator matters) trained 40 steps on the GPU, against
   20 steps, ``save_checkpoint``, a NEW process that ``load_checkpoint``s and trains 20 more.
2. ``mado_tracking.integrations.transformers``: a 1-layer BERT from a config trained by the Hugging Face ``Trainer``
   on the GPU with ``MadoCallback`` (offline run), 40 steps, against one that fails at step 27 and is resumed from
   its step-20 checkpoint with ``resume_from_checkpoint()``.

Prints one line per check (``identical`` or the largest difference) and exits 1 when a check differs; 3 when no
CUDA device is visible. Needs only torch, transformers and the SDK (no server)::

    python benchmarks/gpu_resume_check.py
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NO_GPU = 3
STEPS, SAVE_AT = 40, 20


def deterministic(seed: int):
    import random

    import numpy
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)


def mlp_part(first: int, last: int, directory: Path, *, load: bool, save: bool, device: str) -> bytes:
    """Train steps ``first`` .. ``last - 1`` of the MLP on ``device``; load/save ``directory``; the weights' bytes."""
    import torch
    from torch import nn

    from mado_tracking.torch import load_checkpoint, save_checkpoint

    deterministic(1234 if load else 0)  # a resumed process is seeded otherwise: only the checkpoint may matter
    device = torch.device(device)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Dropout(0.3), nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = torch.Generator(device=device).manual_seed(7)
    if load:
        assert load_checkpoint(directory, model=model, optimizer=optimizer, generators={"batches": batches}) == first
    for _ in range(first, last):
        x = torch.randn(128, 256, device=device, generator=batches)
        y = torch.randint(0, 10, (128,), device=device, generator=batches)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if save:
        save_checkpoint(directory, model=model, optimizer=optimizer, step=last, generators={"batches": batches})
    return b"".join(t.detach().cpu().numpy().tobytes() for t in model.state_dict().values())


def compare(label: str, reference: bytes, resumed: bytes, seconds: float) -> bool:
    if reference == resumed:
        print(f"{label}: identical ({len(reference):,} bytes of weights, {seconds:.1f} s)")
        return True
    differing = sum(a != b for a, b in zip(reference, resumed, strict=False)) + abs(len(reference) - len(resumed))
    print(f"{label}: DIFFERS in {differing:,} of {len(reference):,} bytes ({seconds:.1f} s)")
    return False


def check_mlp(scratch: Path, device: str) -> bool:
    started = time.perf_counter()
    reference = mlp_part(0, STEPS, scratch / "unused", load=False, save=False, device=device)
    mlp_part(0, SAVE_AT, scratch / "mlp", load=False, save=True, device=device)
    resumed = subprocess.run(
        [sys.executable, __file__, "--device", device, "--mlp-resume", str(scratch / "mlp")],
        check=True,
        capture_output=True,
    ).stdout
    label = f"mado_tracking.torch, MLP with dropout on {device}"
    return compare(label, reference, resumed, time.perf_counter() - started)


def hf_trainer(directory: Path, device: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``examples/hf_trainer.py --offline`` (``--gpu`` on CUDA) recording into ``directory`` (weights in
    ``weights.safetensors``)."""
    directory.mkdir(parents=True)
    argv = [sys.executable, str(ROOT / "examples" / "hf_trainer.py"), "--offline"]
    argv += ["--gpu"] if device == "cuda" else []
    argv += ["--output", str(directory / "weights.safetensors"), "--output-dir", str(directory / "out"), *args]
    variables = {k: v for k, v in os.environ.items() if not k.startswith("MMT_")}
    return subprocess.run(
        argv, cwd=directory, env={**variables, "HF_HUB_OFFLINE": "1", **env}, capture_output=True, text=True
    )


def check_hf_trainer(scratch: Path, device: str) -> bool:
    started = time.perf_counter()
    reference = hf_trainer(scratch / "reference", device)
    failed = hf_trainer(scratch / "failed", device, "--fail-at-step", "27")
    if reference.returncode != 0 or failed.returncode != 1:
        print(f"Hugging Face Trainer on {device}: did not run\n{reference.stderr[-3000:]}{failed.stderr[-3000:]}")
        return False
    checkpoint = scratch / "failed" / "out" / f"checkpoint-{SAVE_AT}"
    info = scratch / "resume-checkpoint.json"
    info.write_text(json.dumps({"checkpointId": "local", "sourceRunId": "local", "step": SAVE_AT}))
    resumed = hf_trainer(
        scratch / "resumed",
        device,
        MMT_RESUME_CHECKPOINT_DIR=str(checkpoint),
        MMT_RESUME_STEP=str(SAVE_AT),
        MMT_RESUME_CHECKPOINT_FILE=str(info),
    )
    if resumed.returncode != 0:
        print(f"Hugging Face Trainer on {device}: the resume failed\n{resumed.stderr[-3000:]}")
        return False
    rng = sorted(path.name for path in checkpoint.glob("rng_state*.pth"))
    print(f"Hugging Face Trainer checkpoint-{SAVE_AT} holds {', '.join(rng)}")
    return compare(
        f"Hugging Face Trainer + MadoCallback on {device} (accumulation, warm-up, shuffled data)",
        (scratch / "reference" / "weights.safetensors").read_bytes(),
        (scratch / "resumed" / "weights.safetensors").read_bytes(),
        time.perf_counter() - started,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mlp-resume", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the same checks without a GPU")
    args = parser.parse_args()
    import torch

    if args.mlp_resume is not None:
        sys.stdout.buffer.write(mlp_part(SAVE_AT, STEPS, args.mlp_resume, load=True, save=False, device=args.device))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_resume_check: no CUDA device visible: nothing to check", file=sys.stderr)
        return NO_GPU
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else args.device
    print(f"gpu_resume_check: {name}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory(prefix="gpu-resume-check-") as scratch:
        results = [check_mlp(Path(scratch), args.device), check_hf_trainer(Path(scratch), args.device)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
