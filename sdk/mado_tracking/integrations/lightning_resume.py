"""``MadoResume``: the Lightning callback that makes ``fit(ckpt_path=...)`` resume exactly and saves on a stop
signal (docs/integrations.md, "PyTorch Lightning"; docs/design/resume.md#exact-resume;
docs/design/runs.md#preemption; docs/design/checkpoints.md#metadata).

Imported through ``mado_tracking.integrations.lightning``.
"""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
from pathlib import Path

import torch

from mado_tracking import preemption as preemption_module
from mado_tracking.integrations.lightning_logger import (  # one Lightning package for both classes
    RNG_PARTS,
    MadoLogger,
    checkpoint_parts,
    pl,
)
from mado_tracking.integrations.restore_report import report_loaded

try:
    import numpy
except ImportError:  # torch runs without numpy; then there is no numpy RNG to keep
    numpy = None

logger = logging.getLogger("mado_tracking")

STATE_VERSION = 1


def rng_states() -> dict:
    """Every RNG state of this process as plain values and tensors (loadable with ``torch.load(weights_only=True)``):
    ``python``, ``numpy`` (when installed), ``torch`` (CPU) and ``cuda`` (every device, once CUDA is initialised)."""
    version, internal, gauss = random.getstate()
    states = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    if numpy is not None:
        name, keys, position, has_gauss, cached = numpy.random.get_state()
        states["numpy"] = {
            "name": str(name),
            "keys": torch.from_numpy(keys.astype("int64")),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> list[str]:
    """Put back what ``rng_states`` returned; return the names of those set (a ``cuda`` state is set only when
    this process has as many CUDA devices)."""
    done = []
    if "python" in states:
        version, internal, gauss = states["python"]
        random.setstate((version, tuple(internal), gauss))
        done.append("python")
    if "numpy" in states and numpy is not None:
        saved = states["numpy"]
        keys = saved["keys"].numpy().astype("uint32")
        numpy.random.set_state((saved["name"], keys, saved["position"], saved["has_gauss"], saved["cached_gaussian"]))
        done.append("numpy")
    if "torch" in states:
        torch.set_rng_state(states["torch"])
        done.append("torch")
    cuda = states.get("cuda")
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)
        done.append("cuda")
    return done


def _loaders(train_dataloader) -> list:
    if isinstance(train_dataloader, dict):
        return [loader for value in train_dataloader.values() for loader in _loaders(value)]
    if isinstance(train_dataloader, (list, tuple)):
        return [loader for value in train_dataloader for loader in _loaders(value)]
    return [] if train_dataloader is None else [train_dataloader]


def stateful(loader) -> bool:
    """True when Lightning saves and restores ``loader``'s position: it has ``state_dict`` and ``load_state_dict``."""
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


class MadoResume(pl.Callback):
    """Exact resume and preemption for a Lightning ``fit`` (add it to ``Trainer(callbacks=[...])``).

    Each checkpoint the trainer writes holds, besides what Lightning saves, this callback's state: every RNG
    (``rng_states``). On ``fit(ckpt_path=...)`` they are set back at ``on_train_start``, the last hook before
    the first batch is fetched. The data position is the loader's: Lightning saves and restores a loader with
    ``state_dict``/``load_state_dict`` (``ResumableDataLoader``); for one without, a run resumed mid-epoch
    says so before its first step (a warning starting "data position not restored"). Then, in a resumed run,
    the restore report goes to the server: every part of the ``.ckpt`` restored, save those named above
    (docs/integrations.md, "What a resume restored").

    With ``preemption=True`` and a ``MadoLogger`` among the trainer's loggers, ``mado_tracking.preemption`` is
    installed from ``on_train_start`` to the end of training for ``signals`` (default SIGTERM and SIGUSR1),
    after Lightning's own handlers, which it calls in turn. At the next ``on_train_batch_end`` (a step
    boundary: the state ``ModelCheckpoint`` saves) it writes a Lightning checkpoint, logs it as the Run's
    Checkpoint at the global step with ``wait=True`` and ``metadata=stop.metadata()``, and exits with 128 +
    the signal number; the Run ends ``preempted``. When Lightning stops first (its ``SIGTERMException``,
    raised at the end of a batch, an epoch or a validation batch) the checkpoint is written from
    ``on_exception`` instead and the exit status becomes 128 + the signal number.
    """

    def __init__(self, *, preemption: bool = True, signals=preemption_module.DEFAULT_SIGNALS):
        self.preemption = preemption
        self.signals = tuple(signals)
        self.stop = None
        self._logger: MadoLogger | None = None
        self._pending_rng: dict | None = None
        self._loaded = False
        self._parts: dict[int, list[str]] = {}
        self._holds: tuple[list[str], int | None] | None = None  # what fit(ckpt_path=...) loaded, until reported

    # -- the state in each checkpoint ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "rng": rng_states()}

    def load_state_dict(self, state_dict: dict) -> None:
        self._loaded = True
        self._pending_rng = state_dict.get("rng") if isinstance(state_dict, dict) else None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        self._parts = {checkpoint.get("global_step", trainer.global_step): checkpoint_parts(checkpoint)}

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        self._holds = (checkpoint_parts(checkpoint), checkpoint.get("global_step"))

    def parts_at(self, step: int) -> list[str] | None:
        """The parts of the checkpoint last written at global step ``step``, or None."""
        return self._parts.get(step)

    # -- fit ----------------------------------------------------------------------------------------------------

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._logger = next((each for each in trainer.loggers if isinstance(each, MadoLogger)), None)
        if self._logger is not None:
            self._logger.companion = self

    def on_train_start(self, trainer, pl_module) -> None:
        if self._loaded or self._holds is not None:
            self._restore(trainer)
        if self.preemption and self._logger is not None and self.stop is None:
            run = self._logger.run if trainer.is_global_zero else None
            self.stop = preemption_module.install(run, signals=self.signals)

    def _restore(self, trainer) -> None:
        self._loaded = False
        states, self._pending_rng = self._pending_rng, None
        restored = set_rng_states(states) if states else []
        not_loaded = {}
        if not states:
            not_loaded = dict.fromkeys(
                RNG_PARTS, "the checkpoint holds no MadoResume state (it was written without the callback)"
            )
            if trainer.is_global_zero:
                logger.warning(
                    "mado: random number generators not restored: the checkpoint holds no MadoResume state (it was "
                    "written without the callback); dropout and shuffling will differ from an uninterrupted run"
                )
        elif "cuda" in states and "cuda" not in restored:
            not_loaded["rng.cuda"] = f"saved on {len(states['cuda'])} CUDA devices, not as many here"
        progress = trainer.fit_loop.epoch_loop.batch_progress.current
        total = trainer.num_training_batches
        if trainer.is_global_zero and 0 < progress.processed < total:
            for loader in _loaders(trainer.train_dataloader):
                if not stateful(loader):
                    not_loaded["data_position"] = (
                        f"{type(loader).__name__} has no state_dict: epoch {trainer.current_epoch} resumes at batch "
                        f"{progress.processed} with batches from a fresh pass; use ResumableDataLoader"
                    )
                    logger.warning(
                        "mado: data position not restored: %s has no state_dict, so epoch %d resumes at batch %d of "
                        "%d with batches drawn from batch 0 of a fresh pass over the data, not the ones an "
                        "uninterrupted run would see; use mado_tracking.integrations.lightning.ResumableDataLoader "
                        "(or a loader with state_dict/load_state_dict) for an exact resume",
                        type(loader).__name__,
                        trainer.current_epoch,
                        progress.processed,
                        total,
                    )
        self._report(trainer, not_loaded)

    def _report(self, trainer, not_loaded: dict[str, str]) -> None:
        """The restore report of ``fit(ckpt_path=...)`` (docs/integrations.md, "What a resume restored"): Lightning
        restored every part of the ``.ckpt`` and the fit loop's progress (the data position at an epoch boundary, or
        within an epoch through a stateful loader), except ``not_loaded``; rank zero only."""
        holds, self._holds = self._holds, None
        if holds is None or not trainer.is_global_zero or not trainer.ckpt_path:
            return
        parts, step = holds
        step = trainer.global_step if step is None else int(step)
        if trainer.global_step != step:
            not_loaded["global_step"] = f"the fit starts at global step {trainer.global_step}, not {step}"
        report_loaded(Path(trainer.ckpt_path).parent, step=step, holds=[*parts, "data_position"], not_loaded=not_loaded)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        stop = self.stop
        if stop is None:
            return
        if stop.agreed() if trainer.world_size > 1 else stop.requested:
            self._save(trainer, stop)
            self._uninstall()
            stop.exit()

    def on_train_end(self, trainer, pl_module) -> None:
        self._uninstall()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        stop = self.stop
        self._forget()
        if stop is None or not stop.requested or not isinstance(exception, SystemExit):
            return
        if exception.code in (None, 0):  # Lightning's own stop on the signal: save here, leave as preempted
            self._save(trainer, stop)
            exception.code = 128 + stop.signum
            if stop.run is not None:
                stop.run.mark_preempting()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._forget()

    def _forget(self) -> None:
        """The end of a trainer call: handlers back, and no RNG state left to set or load to report at a later fit
        (one loaded by ``validate(ckpt_path=...)`` or a fit that failed before training)."""
        self._uninstall()
        self._loaded, self._pending_rng, self._holds = False, None, None

    def _uninstall(self) -> None:
        if self.stop is not None:
            self.stop.uninstall()
            self.stop = None

    def _save(self, trainer, stop) -> None:
        """Write a Lightning checkpoint of this step boundary and log it complete (``wait=True``) with the signal."""
        step = trainer.global_step
        directory = Path(tempfile.mkdtemp(prefix="mado-preempted-"))
        try:
            path = directory / f"preempted-epoch={trainer.current_epoch}-step={step}.ckpt"
            trainer.save_checkpoint(path)  # every rank: Lightning writes from rank zero
            if trainer.is_global_zero and self._logger is not None:
                saved = self._logger.save_file(path, step, includes_optimizer=True, wait=True, metadata=stop.metadata())
                if hasattr(saved, "result"):  # this step was already being saved in the background: wait for it
                    saved.result()
                logger.info("mado: saved the checkpoint at step %d after %s; exiting", step, stop.signal_name)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
