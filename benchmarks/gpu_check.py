"""GPU check driver (docs/design/worker.md#distributed), started by ``benchmarks/gpu_check.sh`` once it has counted the
GPUs.

On a fresh SQLite data directory it starts gunicorn (``metrics_ingest.serve``)
and, in the same run:

1. ``examples/ddp_training.py`` under ``torchrun --standalone
   --nproc-per-node N`` (nccl with CUDA): 40 steps, a sharded checkpoint
   every 10 steps logged to that server as one Checkpoint each; prints how
   long it ran and the checkpoints the server holds as complete;
2. ``benchmarks/gpu_checkpoint_rates.py`` under the same torchrun: the
   sharded checkpoint save, verified restore and load rates (MB/s), on local
   disk and through that server.

``--cpu`` runs the rates on CPU ranks with gloo (the example picks its
backend itself). Prints figures; exits non-zero when a step fails.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from metrics_ingest import ROOT, prepare, serve  # noqa: E402

from mado_tracking.extractdir import remove_tree  # noqa: E402

STEPS, EVERY = 40, 10


def torchrun(nproc: int, script: Path, *args: str, env: dict) -> float:
    """Run ``script`` under ``torchrun --standalone --nproc-per-node nproc``; seconds it took (raises on failure)."""
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            str(script),
            *args,
        ],
        env=env,
        cwd=ROOT,
        check=True,
    )
    return time.perf_counter() - started


def complete_checkpoints(url: str, token: str) -> list[str]:
    """``step N (world size W, B bytes)`` for every complete checkpoint of the ``bench`` project's Runs."""
    headers = {"Authorization": f"Bearer {token}"}
    found = []
    runs = requests.get(f"{url}/api/v1/runs/", params={"project": "bench"}, headers=headers, timeout=30).json()
    for run in runs["results"]:
        page = requests.get(f"{url}/api/v1/runs/{run['id']}/checkpoints/", headers=headers, timeout=30).json()
        found += [
            f"step {c['step']} (world size {c.get('world_size', '?')}, {c.get('tar_size')} bytes)"
            for c in page["results"]
            if c.get("state") == "complete"
        ]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc-per-node", type=int, required=True, help="processes (GPUs) to start")
    parser.add_argument("--size-mib", type=int, default=1024, help="MiB of parameters per rank for the rates")
    parser.add_argument("--workdir", default=None, help="where the data and checkpoints go (default: $TMPDIR)")
    parser.add_argument("--cpu", action="store_true", help="the rates on CPU ranks with gloo")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mado-gpu-check-", dir=args.workdir))
    env = {**os.environ, "MADO_DATA_DIR": str(work / "data"), "PYTHONUNBUFFERED": "1"}
    env.pop("MADO_STORAGE", None)
    try:
        token = prepare(env)
        url, server = serve(env, workers=2, threads=4)
        try:
            code_env = {**env, "MMT_API_URL": url, "MMT_API_TOKEN": token, "MMT_PROJECT": "bench"}
            print(f"== examples/ddp_training.py, {args.nproc_per_node} processes, {STEPS} steps", flush=True)
            seconds = torchrun(
                args.nproc_per_node,
                ROOT / "examples" / "ddp_training.py",
                "--steps",
                str(STEPS),
                "--checkpoint-every",
                str(EVERY),
                "--output",
                str(work / "weights.json"),
                env=code_env,
            )
            listed = complete_checkpoints(url, token)
            print(f"ddp_training: finished in {seconds:.1f} s; complete checkpoints: {', '.join(listed) or 'none'}")
            if not listed:
                raise SystemExit("gpu_check: the example logged no complete checkpoint")
            print(f"== checkpoint save and restore rates, {args.size_mib} MiB per rank", flush=True)
            torchrun(
                args.nproc_per_node,
                ROOT / "benchmarks" / "gpu_checkpoint_rates.py",
                "--size-mib",
                str(args.size_mib),
                "--workdir",
                str(work),
                *(["--cpu"] if args.cpu else []),
                env=code_env,
            )
        finally:
            server.terminate()
            server.wait(timeout=30)
    finally:
        remove_tree(work)


if __name__ == "__main__":
    main()
