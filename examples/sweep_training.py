"""One sweep trial: the digits MLP of ``examples/training.py`` with ``--lr`` and ``--hidden``
(docs/design/runs.md#resume-modes, #one-writer-process, #states; docs/design/sweeps.md#sweeps, #requeue).

    mado sweep create examples/sweep.yaml --project demo    # prints the sweep's id
    mado agent SWEEP_ID --forward-signals                   # on every machine that should run trials

``mado agent`` starts this program once per trial, e.g. ``python
examples/sweep_training.py --steps 60 --checkpoint-every 10 --lr=0.01
--hidden=32``, with ``MMT_RUN_ID`` (the trial's run id) and
``MMT_RESUME=allow``: ``start_run()`` starts that Run, or resumes it when the
trial comes back. Every step logs ``loss`` (cross-entropy of the minibatch)
and ``val_loss`` (cross-entropy on a held-out fifth of the digits, the
sweep's metric); every ``--checkpoint-every`` steps model, optimizer and RNG
states are saved as a checkpoint (``step`` = steps completed).

Preemption: on SIGTERM or SIGUSR1 (a preemptible machine's notice, passed on
by ``mado agent --forward-signals``) the program calls
``run.mark_preempting()`` at once, finishes the current step, saves a
checkpoint and exits 1: the Run ends ``preempted``, the sweep requeues the
trial, and the next agent resumes it under the same run id from that
checkpoint (``run.resume_checkpoint()``), continuing at its step with the
same weights, optimizer and random numbers.
"""

import argparse
import signal
import sys
import tempfile
import time

import torch
from torch import nn
from training import load_data, make_optimizer, seed_everything, train_step

import mado_tracking
from mado_tracking.torch import load_checkpoint, save_checkpoint

VALIDATION_FRACTION = 0.2
SPLIT_SEED = 99  # the same held-out digits in every trial, whatever --seed is


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    parser.add_argument("--hidden", type=int, default=64, help="units of the hidden layer (default 64)")
    parser.add_argument("--steps", type=int, default=60, help="total optimisation steps (default 60)")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=10,
        metavar="K",
        help="save a checkpoint every K steps (default 10; 0: only when preempted)",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="examples per step (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random number generator (default 0)")
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=0.0,
        metavar="S",
        help="pause S seconds after each step, standing in for a bigger model (default 0)",
    )
    args = parser.parse_args(argv)
    for name in ("steps", "checkpoint_every", "step_seconds"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.lr <= 0 or args.hidden < 1 or args.batch_size < 1:
        parser.error("--lr must be > 0, --hidden and --batch-size >= 1")
    return args


def split(data: tuple[torch.Tensor, torch.Tensor]) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """``(train, validation)``: a fixed random fifth of the digits is held out."""
    x, y = data
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(SPLIT_SEED))
    cut = int(x.shape[0] * (1 - VALIDATION_FRACTION))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def build_model(hidden: int, in_features: int = 64, classes: int = 10) -> nn.Module:
    """A two-layer MLP: ``[batch, 64]`` pixels → ``hidden`` units → ``[batch, 10]`` logits."""
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, classes))


@torch.no_grad()
def validation_loss(model: nn.Module, validation: tuple[torch.Tensor, torch.Tensor]) -> float:
    model.eval()
    return nn.functional.cross_entropy(model(validation[0]), validation[1]).item()


class Preemption:
    """SIGTERM / SIGUSR1 handler: marks the Run preempting at once; the loop then checkpoints and exits 1."""

    def __init__(self, run):
        self.run = run
        self.signal: int | None = None

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(signum, self)

    def __call__(self, signum: int, frame) -> None:
        if self.signal is None:
            self.signal = signum
            self.run.mark_preempting()


def train(run, args: argparse.Namespace, preemption: Preemption) -> int:
    """Train from the resumed checkpoint (or step 0) to ``--steps``; return the steps completed."""
    generator = seed_everything(args.seed)
    (x, y), validation = split(load_data())
    model = build_model(args.hidden)
    optimizer = make_optimizer(model, args.lr)
    start = 0
    checkpoint = run.resume_checkpoint()
    if checkpoint is not None:
        start = load_checkpoint(checkpoint.path, model=model, optimizer=optimizer, generators={"batches": generator})
        print(f"resuming run {run.external_id} from checkpoint {checkpoint.id} at step {start}", flush=True)
    saved = start
    with tempfile.TemporaryDirectory(prefix="mado-sweep-ckpt-") as scratch:
        for step in range(start, args.steps):
            index = torch.randint(0, x.shape[0], (args.batch_size,), generator=generator)
            loss, _ = train_step(model, optimizer, x[index], y[index])
            run.log_metrics({"loss": loss, "val_loss": validation_loss(model, validation)}, step=step)
            done = step + 1
            due = args.checkpoint_every and done % args.checkpoint_every == 0
            if (due or preemption.signal is not None) and saved != done:
                save_checkpoint(scratch, model=model, optimizer=optimizer, step=done, generators={"batches": generator})
                run.log_checkpoint(scratch, step=done, includes_optimizer=True, framework="torch")
                saved = done
            if preemption.signal is not None:
                return done
            time.sleep(args.step_seconds)
    return args.steps


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parameters = {
        "lr": args.lr,
        "hidden": args.hidden,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "optimizer": "sgd",
        "dataset": "sklearn.digits",
    }
    with mado_tracking.start_run(kind="training", parameters=parameters) as run:  # id, resume: MMT_RUN_ID, MMT_RESUME
        preemption = Preemption(run)
        preemption.install()
        print(f"run {run.external_id} (lr={args.lr}, hidden={args.hidden}): {run.url}", flush=True)
        done = train(run, args, preemption)
        if done < args.steps:
            print(
                f"preempted ({signal.Signals(preemption.signal).name}) after step {done}: checkpoint saved, exiting 1",
                flush=True,
            )
            sys.exit(1)  # non-zero after mark_preempting: the Run ends preempted and the trial is requeued
    print(f"finished {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
