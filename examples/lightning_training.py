"""Train a small MLP with PyTorch Lightning and log it to mado (docs/integrations.md, "PyTorch Lightning").

A LightningModule (two linear layers with dropout between them, so the RNG matters) learns to classify 256
generated points into 4 classes, 16 shuffled batches an epoch, deterministic on CPU. ``MadoLogger`` records
the parameters and ``train.loss`` at each global step, every file ``ModelCheckpoint`` saves
(``every_n_train_steps=--checkpoint-every``) becomes a Checkpoint of the Run, and ``MadoResume`` makes a
resumed fit byte-identical to an uninterrupted one and saves on SIGTERM::

    MMT_API_URL=http://127.0.0.1:8000 MMT_API_TOKEN=... MMT_PROJECT=demo \\
        python examples/lightning_training.py --steps 40 --checkpoint-every 10

``--fail-at-step S`` stops with an error at global step S; resumed (a Job's ``mado job resume --latest``, or the
``MMT_RESUME_*`` variables) the program hands the checkpoint's ``.ckpt`` file to ``trainer.fit(ckpt_path=...)``
and ends with exactly the weights of an uninterrupted run (``--output PATH`` writes them as JSON).
``--offline`` needs no server and records into the directory of ``--output``::

    python examples/lightning_training.py --offline --fail-at-step 27 --output /tmp/x/weights.json
    echo '{"checkpointId": "local", "sourceRunId": "local", "step": 20}' > /tmp/x/resume.json
    MMT_RESUME_CHECKPOINT_DIR=/tmp/x/checkpoints/step-20 MMT_RESUME_STEP=20 \\
    MMT_RESUME_CHECKPOINT_FILE=/tmp/x/resume.json \\
        python examples/lightning_training.py --offline --output /tmp/x/resumed.json

``--plain`` resumes the way Lightning does alone (a plain shuffled DataLoader, no MadoResume): the weights
then differ from an uninterrupted run's. ``--step-seconds S`` sleeps after each step, to leave time for a
signal.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from mado_tracking.integrations.lightning import MadoLogger, MadoResume, ResumableDataLoader, resume_ckpt_path

FEATURES, CLASSES, SAMPLES = 16, 4, 256
DATA_SEED = 1234  # the data set is the same in every process, whatever --seed is


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="total optimizer steps (default 40)")
    parser.add_argument("--checkpoint-every", type=int, default=10, metavar="K", help="checkpoint every K steps")
    parser.add_argument("--batch-size", type=int, default=16, help="examples per step (default 16: 16 per epoch)")
    parser.add_argument("--hidden", type=int, default=32, help="hidden units (default 32)")
    parser.add_argument("--dropout", type=float, default=0.2, help="dropout probability (default 0.2)")
    parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default 0.1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every RNG and of the data order (default 0)")
    parser.add_argument("--fail-at-step", type=int, default=None, metavar="S", help="stop with an error at step S")
    parser.add_argument("--output", default=None, metavar="PATH", help="write the final weights as JSON to PATH")
    parser.add_argument("--offline", action="store_true", help="no server: record into the directory of --output")
    parser.add_argument("--plain", action="store_true", help="resume as Lightning does alone (not exactly)")
    parser.add_argument("--step-seconds", type=float, default=0.0, metavar="S", help="sleep S s after each step")
    args = parser.parse_args(argv)
    for name in ("steps", "checkpoint_every", "batch_size", "hidden"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.dropout < 1:
        parser.error("--dropout must be in [0, 1)")
    if args.offline and not args.output:
        parser.error("--offline needs --output (the run is recorded in its directory)")
    return args


class SimulatedFailure(RuntimeError):
    """Raised by ``--fail-at-step``."""


class Classifier(pl.LightningModule):
    """``[batch, 16]`` points → ``[batch, 4]`` logits through Linear, ReLU, Dropout, Linear; SGD with momentum."""

    def __init__(self, hidden: int, dropout: float, lr: float):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, CLASSES)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train.loss", loss, on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class Pace(pl.Callback):
    """Says when training starts, fails at ``--fail-at-step``, sleeps ``--step-seconds`` after each step."""

    def __init__(self, fail_at_step: int | None, step_seconds: float):
        self.fail_at_step, self.step_seconds = fail_at_step, step_seconds

    def on_train_start(self, trainer, pl_module):
        print(f"training from step {trainer.global_step}", flush=True)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.fail_at_step:
            raise SimulatedFailure(f"--fail-at-step {self.fail_at_step}: stopping at step {trainer.global_step}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.step_seconds:
            time.sleep(self.step_seconds)


def dataset() -> TensorDataset:
    """256 points of 16 features, labelled by the largest of 4 fixed random projections (with a little noise)."""
    generator = torch.Generator().manual_seed(DATA_SEED)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    projection = torch.randn(FEATURES, CLASSES, generator=generator)
    y = (x @ projection + 0.1 * torch.randn(SAMPLES, CLASSES, generator=generator)).argmax(dim=1)
    return TensorDataset(x, y)


def weights_json(model: nn.Module) -> str:
    """The weights as JSON text, ``{name: flat list of floats}`` in ``state_dict`` order (exact repr)."""
    return json.dumps({name: tensor.detach().flatten().tolist() for name, tensor in model.state_dict().items()}) + "\n"


def train(args: argparse.Namespace, logger: MadoLogger, checkpoint_dir: str) -> Classifier:
    pl.seed_everything(args.seed, workers=True, verbose=False)
    torch.set_num_threads(1)
    model = Classifier(args.hidden, args.dropout, args.lr)
    if args.plain:
        loader = DataLoader(dataset(), batch_size=args.batch_size, shuffle=True)
        callbacks = []
    else:
        loader = ResumableDataLoader(dataset(), batch_size=args.batch_size, shuffle=True, seed=args.seed)
        callbacks = [MadoResume()]
    checkpoints = ModelCheckpoint(dirpath=checkpoint_dir, every_n_train_steps=args.checkpoint_every, save_top_k=-1)
    trainer = pl.Trainer(
        max_steps=args.steps,
        logger=logger,
        callbacks=[checkpoints, *callbacks, Pace(args.fail_at_step, args.step_seconds)],
        log_every_n_steps=1,
        deterministic=True,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    ckpt_path = resume_ckpt_path(logger)
    if ckpt_path is not None:
        print(f"resuming from {os.path.basename(ckpt_path)}", flush=True)
    trainer.fit(model, loader, ckpt_path=ckpt_path)
    return model


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parameters = {"steps": args.steps, "batch_size": args.batch_size, "seed": args.seed, "plain": args.plain}
    # The logger starts the Run (in a Job: attaches to the Job's Run) with these and the model's hyperparameters,
    # and finishes it when the fit ends.
    logger = MadoLogger(
        parameters=parameters,
        offline=True if args.offline else None,
        output=Path(args.output).parent if args.offline else None,
    )
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="lightning-ckpt-") as checkpoint_dir:
            model = train(args, logger, checkpoint_dir)
    except SimulatedFailure as failure:
        print(f"failed: {failure}", file=sys.stderr, flush=True)
        return 1
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(weights_json(model), encoding="utf-8")
    print(f"run {logger.version}: {args.steps} steps in {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
