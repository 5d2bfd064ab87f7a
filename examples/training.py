"""Train a small MLP on scikit-learn's digits and log it to mado (SPEC F19, F2, F1, F17, F18).

Real PyTorch training on a real data set that ships with scikit-learn (1,797
8x8 images of handwritten digits, no download), deterministic on CPU: the same
``--seed`` gives the same weights and the same metric values. Every step logs
``train.loss`` (cross-entropy of the minibatch) and ``train.accuracy``
(fraction of the minibatch classified correctly) through ``mado_tracking``.

    MMT_API_URL=http://127.0.0.1:8000 MMT_API_TOKEN=... MMT_PROJECT=demo \\
        python examples/training.py --steps 200 --name my-first-run

The loop runs over ``range(start_step, steps)`` and all training state lives
in ``model``, ``optimizer``, ``generator`` and the global RNGs, which
``mado_tracking.torch`` saves every ``--checkpoint-every`` steps (then
``run.log_checkpoint(dir, step=step + 1, ...)``) and restores when the
program is started with the ``MMT_RESUME_*`` variables (``run.resume_checkpoint()``):
the resumed run continues at the checkpoint's step and ends with exactly the
weights of an uninterrupted run. ``--fail-at-step S`` stops with an error at
step S; ``--output PATH`` writes the final weights as JSON (byte-comparable);
``--offline`` needs no server and records into the directory of ``--output``::

    python examples/training.py --offline --steps 40 --checkpoint-every 10 --fail-at-step 27 \
        --output /tmp/x/weights.json          # fails, leaves /tmp/x/checkpoints/step-10, step-20
    echo '{"checkpointId": "local", "sourceRunId": "local", "step": 20}' > /tmp/x/resume.json
    MMT_RESUME_CHECKPOINT_DIR=/tmp/x/checkpoints/step-20 MMT_RESUME_STEP=20 \
    MMT_RESUME_CHECKPOINT_FILE=/tmp/x/resume.json \
        python examples/training.py --offline --steps 40 --checkpoint-every 10 --output /tmp/x/resumed.json
"""

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

import mado_tracking
from mado_tracking.torch import load_checkpoint, save_checkpoint

HIDDEN = 64
MOMENTUM = 0.9


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="total optimisation steps (default 200)")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per step (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random number generator (default 0)")
    parser.add_argument("--project", default=None, help="mado project slug (default: $MMT_PROJECT)")
    parser.add_argument("--name", default=None, help="name of the Run (default: none)")
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="K",
                        help="save a checkpoint every K steps (default 0: never)")
    parser.add_argument("--fail-at-step", type=int, default=None, metavar="S",
                        help="stop with an error when step S is reached (to try resuming)")
    parser.add_argument("--output", default=None, metavar="PATH",
                        help="write the final weights as JSON to PATH; offline, its directory holds the run")
    parser.add_argument("--offline", action="store_true",
                        help="no server: record into the directory of --output (else $MMT_OFFLINE_DIR); "
                             "upload later with `mado sync DIR`")
    args = parser.parse_args(argv)
    if args.steps < 0:
        parser.error("--steps must be >= 0")
    if args.batch_size < 1:
        parser.error("--batch-size must be >= 1")
    if args.checkpoint_every < 0:
        parser.error("--checkpoint-every must be >= 0")
    return args


class SimulatedFailure(RuntimeError):
    """Raised by ``--fail-at-step``."""


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch, force deterministic kernels; return the generator that draws batches."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    return torch.Generator().manual_seed(seed)


def load_data() -> tuple[torch.Tensor, torch.Tensor]:
    """Digits as ``(x, y)``: x float32 ``[1797, 64]`` scaled to [0, 1], y int64 ``[1797]`` in 0..9."""
    digits = load_digits()
    x = torch.from_numpy(digits.data.astype(np.float32) / 16.0)
    y = torch.from_numpy(digits.target.astype(np.int64))
    return x, y


def build_model(in_features: int = 64, classes: int = 10) -> nn.Module:
    """A two-layer MLP: ``[batch, 64]`` pixels → ``[batch, 10]`` logits."""
    return nn.Sequential(nn.Linear(in_features, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, classes))


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> tuple[float, float]:
    """One SGD step on the minibatch; returns its (loss, accuracy) before the update."""
    model.train()
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    accuracy = (logits.argmax(dim=1) == y).float().mean()
    return loss.item(), accuracy.item()


def train(run, model: nn.Module, optimizer: torch.optim.Optimizer, data: tuple[torch.Tensor, torch.Tensor],
          generator: torch.Generator, *, start_step: int, steps: int, batch_size: int, checkpoint_every: int = 0,
          fail_at_step: int | None = None) -> dict:
    """Run steps ``start_step .. steps-1``, logging ``train.loss`` and ``train.accuracy`` at each step index.

    Every ``checkpoint_every`` steps the state is saved with ``step`` = steps
    completed; reaching ``fail_at_step`` raises ``SimulatedFailure``.
    """
    x, y = data
    loss = accuracy = float("nan")
    with tempfile.TemporaryDirectory(prefix="mado-example-ckpt-") as scratch:
        for step in range(start_step, steps):
            if step == fail_at_step:
                raise SimulatedFailure(f"--fail-at-step {fail_at_step}: stopping at step {step}")
            index = torch.randint(0, x.shape[0], (batch_size,), generator=generator)
            loss, accuracy = train_step(model, optimizer, x[index], y[index])
            run.log_metrics({"train.loss": loss, "train.accuracy": accuracy}, step=step)
            if checkpoint_every and (step + 1) % checkpoint_every == 0:
                save_checkpoint(scratch, model=model, optimizer=optimizer, step=step + 1,
                                generators={"batches": generator})
                run.log_checkpoint(scratch, step=step + 1, includes_optimizer=True, framework="torch")
    return {"train.loss": loss, "train.accuracy": accuracy}


def weights_json(model: nn.Module) -> str:
    """The weights as JSON text, ``{name: flat list of floats}`` in ``state_dict`` order (shortest exact repr)."""
    return json.dumps({name: tensor.detach().flatten().tolist() for name, tensor in model.state_dict().items()}) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    generator = seed_everything(args.seed)
    data = load_data()
    model = build_model()
    optimizer = make_optimizer(model, args.lr)
    parameters = {"steps": args.steps, "lr": args.lr, "batch_size": args.batch_size, "seed": args.seed,
                  "hidden": HIDDEN, "momentum": MOMENTUM, "optimizer": "sgd", "dataset": "sklearn.digits"}
    offline_dir = Path(args.output).parent if args.offline and args.output else None
    started = time.monotonic()
    try:
        with mado_tracking.start_run(project=args.project, name=args.name, kind="training", parameters=parameters,
                                     offline=True if args.offline else None, output=offline_dir) as run:
            label = "offline run" if run.id is None else f"run {run.id}"
            print(f"{label} ({run.external_id}): {run.url}", flush=True)
            start_step = 0
            checkpoint = run.resume_checkpoint()
            if checkpoint is not None:
                load_checkpoint(checkpoint.path, model=model, optimizer=optimizer, generators={"batches": generator})
                start_step = checkpoint.step
                print(f"resuming from checkpoint {checkpoint.id} at step {start_step}", flush=True)
            final = train(run, model, optimizer, data, generator, start_step=start_step, steps=args.steps,
                          batch_size=args.batch_size, checkpoint_every=args.checkpoint_every,
                          fail_at_step=args.fail_at_step)
    except SimulatedFailure as failure:
        print(f"failed: {failure}", file=sys.stderr, flush=True)
        return 1
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(weights_json(model), encoding="utf-8")
    print(f"steps {start_step}..{args.steps} in {time.monotonic() - started:.1f} s: "
          f"train.loss {final['train.loss']:.4f}, train.accuracy {final['train.accuracy']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
