"""Train a small MLP on scikit-learn's digits and log it to mado (SPEC F19, F2).

Real PyTorch training on a real data set that ships with scikit-learn (1,797
8x8 images of handwritten digits, no download), deterministic on CPU: the same
``--seed`` gives the same weights and the same metric values. Every step logs
``train.loss`` (cross-entropy of the minibatch) and ``train.accuracy``
(fraction of the minibatch classified correctly) through ``mado_tracking``.

    MMT_API_URL=http://127.0.0.1:8000 MMT_API_TOKEN=... MMT_PROJECT=demo \\
        python examples/training.py --steps 200 --name my-first-run

The loop runs over ``range(start_step, steps)`` and all training state lives
in ``model``, ``optimizer`` and ``generator``, so saving and restoring a
checkpoint (``--checkpoint-every``, resume) only has to capture those.
"""

import argparse
import random
import sys
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

import mado_tracking

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
    args = parser.parse_args(argv)
    if args.steps < 0:
        parser.error("--steps must be >= 0")
    if args.batch_size < 1:
        parser.error("--batch-size must be >= 1")
    return args


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
          generator: torch.Generator, *, start_step: int, steps: int, batch_size: int) -> dict:
    """Run steps ``start_step .. steps-1``, logging ``train.loss`` and ``train.accuracy`` at each step index."""
    x, y = data
    loss = accuracy = float("nan")
    for step in range(start_step, steps):
        index = torch.randint(0, x.shape[0], (batch_size,), generator=generator)
        loss, accuracy = train_step(model, optimizer, x[index], y[index])
        run.log_metrics({"train.loss": loss, "train.accuracy": accuracy}, step=step)
    return {"train.loss": loss, "train.accuracy": accuracy}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    generator = seed_everything(args.seed)
    data = load_data()
    model = build_model()
    optimizer = make_optimizer(model, args.lr)
    parameters = {"steps": args.steps, "lr": args.lr, "batch_size": args.batch_size, "seed": args.seed,
                  "hidden": HIDDEN, "momentum": MOMENTUM, "optimizer": "sgd", "dataset": "sklearn.digits"}
    started = time.monotonic()
    with mado_tracking.start_run(project=args.project, name=args.name, kind="training",
                                 parameters=parameters) as run:
        print(f"run {run.id} ({run.external_id}): {run.url}", flush=True)
        final = train(run, model, optimizer, data, generator, start_step=0, steps=args.steps,
                      batch_size=args.batch_size)
    print(f"{args.steps} steps in {time.monotonic() - started:.1f} s: train.loss {final['train.loss']:.4f}, "
          f"train.accuracy {final['train.accuracy']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
