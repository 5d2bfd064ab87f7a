"""In-process Lightning fits of ``examples/lightning_training.py``'s model and data for the integration's tests."""

import importlib.util
import io
import os
import signal
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from mado_tracking.integrations.lightning import MadoResume, ResumableDataLoader

EXAMPLE_PATH = Path(__file__).resolve().parents[2] / "examples" / "lightning_training.py"
_spec = importlib.util.spec_from_file_location("lightning_training_example", EXAMPLE_PATH)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


def weights(model) -> bytes:
    """The model's ``state_dict`` as bytes (equal bytes: equal weights)."""
    buffer = io.BytesIO()
    for name, tensor in model.state_dict().items():
        buffer.write(name.encode() + b"\0" + tensor.detach().cpu().contiguous().numpy().tobytes())
    return buffer.getvalue()


class Events(pl.Callback):
    """Appends ``("step", global_step)`` to ``seen`` before each batch."""

    def __init__(self, seen: list):
        self.seen = seen

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append(("step", trainer.global_step))


class SignalAt(pl.Callback):
    """Sends ``signum`` to this process when the global step reaches ``step``: from a callback's
    ``on_train_batch_start`` (``late=False``) or from the LightningModule's ``on_train_batch_end``, which runs after
    every callback's (``late=True``: MadoResume's check has passed, Lightning's own stop comes first)."""

    def __init__(self, step: int, *, late: bool = False, signum: int = signal.SIGTERM):
        self.step, self.late, self.signum = step, late, signum

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not self.late and trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)

    def setup(self, trainer, pl_module, stage):
        if self.late:
            original = pl_module.on_train_batch_end

            def late_signal(*args, **kwargs):
                original(*args, **kwargs)
                if trainer.global_step == self.step + 1:
                    os.kill(os.getpid(), self.signum)

            pl_module.on_train_batch_end = late_signal


def fit(
    directory,
    *,
    exact_data: bool = True,
    mado_resume: bool = True,
    fail_at: int | None = None,
    ckpt_path=None,
    logger=False,
    callbacks=(),
    steps: int = 40,
    save_last: bool = False,
    accelerator: str = "cpu",
):
    """Fit the example's model for ``steps`` global steps, checkpointing every 10 into ``directory``; return it.

    ``exact_data``: a ``ResumableDataLoader`` (else a plain shuffled ``DataLoader``); ``mado_resume``: with
    ``MadoResume``; ``fail_at``: raise ``example.SimulatedFailure`` at that global step.
    """
    pl.seed_everything(0, workers=True, verbose=False)
    torch.set_num_threads(1)
    model = example.Classifier(32, 0.2, 0.1)
    data = example.dataset()
    loader = ResumableDataLoader(data, batch_size=16, seed=0) if exact_data else DataLoader(data, 16, shuffle=True)
    checkpoints = ModelCheckpoint(dirpath=directory, every_n_train_steps=10, save_top_k=-1, save_last=save_last)
    trainer = pl.Trainer(
        max_steps=steps,
        logger=logger,
        callbacks=[checkpoints, *([MadoResume()] if mado_resume else []), example.Pace(fail_at, 0), *callbacks],
        log_every_n_steps=1,
        deterministic=True,
        accelerator=accelerator,
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=directory,
    )
    trainer.fit(model, loader, ckpt_path=ckpt_path)
    return model


def restore_torch_globals():
    """Undo what a Lightning ``deterministic=True`` fit and ``set_num_threads`` change process-wide."""
    deterministic, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG")

    def restore():
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)
        if cublas is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = cublas

    return restore
