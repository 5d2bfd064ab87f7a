"""``MadoLogger``: a PyTorch Lightning logger that records a mado Run, and turns each file ``ModelCheckpoint`` saves
into a mado Checkpoint at the trainer's global step (docs/integrations.md, "PyTorch Lightning";
docs/design/checkpoints.md#a-checkpoint, #metadata; docs/design/resume.md#steps-continue).

Imported through ``mado_tracking.integrations.lightning``.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import shutil
import tempfile
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name, same API
    import pytorch_lightning as pl

from mado_tracking._base import new_external_id
from mado_tracking.errors import MadoError
from mado_tracking.integrations.restore_report import report_loaded
from mado_tracking.resume import ENV_NAMES, resume_checkpoint
from mado_tracking.resume_mode import ENV_RESUME, ENV_RUN_ID

rank_zero_only = pl.utilities.rank_zero_only
logger = logging.getLogger("mado_tracking")

FRAMEWORK = "lightning"
MAX_NAMED_KEYS = 10
RESUME_CALLBACK = "MadoResume"  # MadoResume's state key in a checkpoint's "callbacks"
WITHOUT_RESUME = "no MadoResume among the trainer's callbacks"
RNG_PARTS = ("rng.python", "rng.numpy", "rng.torch")  # what MadoResume keeps besides CUDA's
# Lightning's finalize statuses that end the Run; "finished" also comes from the SLURM requeue handler
# mid-training, to flush, and ends nothing.
FINAL_STATUSES = {"success": "finished", "failed": "failed"}


def flatten_parameters(params, *, prefix: str = "", separator: str = "/") -> dict:
    """``params`` (a dict or ``argparse.Namespace``, nested freely) as one level of JSON-safe values.

    Nested keys are joined with ``separator`` (``{"optim": {"lr": 0.1}}`` → ``{"optim/lr": 0.1}``); bools,
    ints, finite floats, str and None stay, a number-like scalar (numpy, a one-element tensor) becomes a
    number, NaN and ±inf become ``"nan"`` / ``"inf"``, a list or tuple of such values stays a list, and
    anything else becomes its ``str()`` (a callable its name). Empty containers are dropped.
    """
    if isinstance(params, Namespace):
        params = vars(params)
    flat: dict = {}
    if not isinstance(params, Mapping):
        raise ValueError(f"hyperparameters must be a dict or argparse.Namespace, got {type(params).__name__}")
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Namespace):
            value = vars(value)
        if isinstance(value, Mapping):
            flat.update(flatten_parameters(value, prefix=f"{name}{separator}", separator=separator))
        else:
            flat[name] = _json_value(value)
    return flat


def _json_value(value):
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(item) for item in value]
    if callable(getattr(value, "item", None)) and (
        getattr(value, "ndim", None) == 0 or len(getattr(value, "shape", ())) == 1 and value.shape[0] == 1
    ):
        try:
            return _json_value(value.item())
        except (TypeError, ValueError, RuntimeError):
            return str(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else str(value)
    if callable(value):
        return getattr(value, "__qualname__", None) or getattr(value, "__name__", None) or str(value)
    return str(value)


class _RunOnFirstUse:
    """What ``MadoLogger.experiment`` is before the Run started: any attribute starts it (Lightning only reads
    ``experiment`` to trigger a lazy start, before it hands over the hyperparameters the Run should start with)."""

    def __init__(self, owner: MadoLogger):
        self._owner = owner

    def __getattr__(self, name):
        return getattr(self._owner.run, name)


class MadoLogger(pl.loggers.Logger):
    """A Lightning logger writing to one mado Run (rank zero only; other ranks do nothing).

    ``run``: a Run you started (``mado_tracking.start_run``); it stays yours: the logger finishes it only with
    ``finish_run=True``. Without it the logger starts one when first needed, with ``start_run``'s arguments
    given here (``project``, ``name``, ``kind``, ``parameters``, ``id``, ``resume``, ``offline``, ``output``;
    in a Job it attaches to the Job's Run), merging in the hyperparameters Lightning hands over at the start of
    ``fit`` (``save_hyperparameters()``), and finishes it when Lightning finalizes (``finish_run=None``).

    What is recorded: ``log_hyperparams`` → the Run's parameters (``flatten_parameters``; a Run's parameters
    are set when it starts, so values handed over later that it lacks are named in a warning, not sent);
    ``log_metrics`` → points at the step Lightning passes (its count of optimizer steps across epochs: the
    metrics of the step that brings ``trainer.global_step`` to N+1 are at N, so a run resumed from a checkpoint
    at global step N logs from N on); each file ``ModelCheckpoint`` saves → a Checkpoint at the global step it
    was saved at (one per step: ``last.ckpt`` and a second callback's copy of the same state are skipped),
    uploaded in the background (``wait=False``) with ``framework="lightning"`` and ``training_state`` metadata;
    ``finalize("success")`` → ``finished``, ``finalize("failed")`` → ``failed`` (``preempted`` after a stop
    signal, see ``MadoResume``).

    Starting the Run raises what ``start_run`` raises (``ConfigError``, ``ApiError``, ``ValueError``), from the
    Lightning hook that needed it; a ``flatten_parameters`` refusal of ``parameters`` raises ``ValueError`` here.
    """

    def __init__(
        self,
        run=None,
        *,
        project: str | None = None,
        name: str | None = None,
        kind: str = "training",
        parameters: Mapping | None = None,
        id: str | None = None,
        resume: str | None = None,
        offline: bool | None = None,
        output=None,
        finish_run: bool | None = None,
    ):
        super().__init__()
        self._run = run
        self._start_arguments = {
            "project": project,
            "name": name,
            "kind": kind,
            "id": id,
            "resume": resume,
            "offline": offline,
            "output": output,
        }
        self._parameters = flatten_parameters(parameters or {})
        self._finish_run = run is None if finish_run is None else bool(finish_run)
        self._finalized = False
        self._saved: dict[int, object] = {}  # global step → SavedCheckpoint or Future of this process's saves
        self._warned: set[str] = set()
        self.companion = None  # the MadoResume callback of the same trainer, which records what a checkpoint holds
        self._resumed_from = None  # the ResumeCheckpoint resume_checkpoint() handed out
        self._reported = False  # the first log_metrics looked for a resume to report

    # -- the Run ------------------------------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """True once the Run exists (given, or started by this logger)."""
        return self._run is not None

    @property
    def run(self):
        """The Run (``Run`` or ``OfflineRun``), started now if it was not yet."""
        if self._run is None:
            import mado_tracking

            arguments = dict(self._start_arguments)
            if arguments["id"] is None and self._needs_own_id():
                arguments["id"] = self._own_id()
            self._run = mado_tracking.start_run(parameters=self._parameters, **arguments)
        return self._run

    def _needs_own_id(self) -> bool:
        return not os.environ.get(ENV_RUN_ID, "").strip() and not self._resume_mode()

    def _resume_mode(self) -> str | None:
        return self._start_arguments["resume"] or os.environ.get(ENV_RESUME, "").strip().lower() or None

    def _own_id(self) -> str:
        # chosen before the start, so ``version`` (ModelCheckpoint's default directory) needs no Run yet
        self._start_arguments["id"] = self._start_arguments["id"] or new_external_id()
        return self._start_arguments["id"]

    @property
    @pl.loggers.logger.rank_zero_experiment
    def experiment(self):
        """The Run once started, else a stand-in that starts it on first use."""
        return self._run if self._run is not None else _RunOnFirstUse(self)

    @property
    def name(self) -> str:
        return "mado"

    @property
    def version(self) -> str:
        """The run id (known before the Run starts unless a resume mode picks it)."""
        if self._run is not None:
            return self._run.external_id
        chosen = self._start_arguments["id"] or os.environ.get(ENV_RUN_ID, "").strip()
        if chosen:
            return chosen
        return self._own_id() if self._needs_own_id() else self.run.external_id

    def resume_checkpoint(self):
        """The ``ResumeCheckpoint`` this run resumes from, or None, without starting the Run when the answer is
        known without it: a Job's resume (``MMT_RESUME_*``) or a fresh run (no resume mode). A same-run resume
        (``resume=`` / ``MMT_RESUME``) starts it, which fetches the Run's latest checkpoint."""
        if self._run is None and (
            any(os.environ.get(name, "").strip() for name in ENV_NAMES) or not self._resume_mode()
        ):
            self._resumed_from = resume_checkpoint()
        else:
            self._resumed_from = self.run.resume_checkpoint()
        return self._resumed_from

    # -- Lightning's Logger interface ---------------------------------------------------------------------------

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        """Record ``params`` as the Run's parameters (flattened, JSON-safe); see the class docstring."""
        flat = flatten_parameters(params)
        if self._run is None:
            self._parameters.update(flat)
            _ = self.run  # start now: the Run shows as running while the trainer prepares
            return
        recorded = getattr(self._run, "parameters", None) or {}
        missing = sorted(
            key for key, value in flat.items() if _canonical(recorded.get(key, _MISSING)) != _canonical(value)
        )
        if missing and "hyperparameters" not in self._warned:
            self._warned.add("hyperparameters")
            named = ", ".join(missing[:MAX_NAMED_KEYS]) + (" …" if len(missing) > MAX_NAMED_KEYS else "")
            logger.warning(
                "mado: hyperparameters %s are not recorded on run %s: a Run's parameters are set when it starts; "
                "pass them to start_run(parameters=...) or MadoLogger(parameters=...), or let MadoLogger start the Run",
                named,
                self._run.external_id,
            )

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Record ``metrics`` at ``step`` (the step Lightning passes; see the class docstring)."""
        if self._finalized and self._finish_run:
            if "after-finish" not in self._warned:
                self._warned.add("after-finish")
                logger.warning("mado: run %s is finished; metrics logged after fit are not recorded", self.version)
            return
        values = {key: _number(value) for key, value in metrics.items()}
        if not self._reported:
            self._reported = True
            if self.companion is None:
                self._report_without_resume(step)
        self.run.log_metrics(values, step=step)

    def _report_without_resume(self, step: int | None) -> None:
        """The restore report of a fit resumed with this logger but no ``MadoResume`` (which reports otherwise),
        sent before the first metrics: the parts of the ``.ckpt`` restored, the RNGs and the data position not
        restored (Lightning keeps neither without ``MadoResume``), and a WARNING line saying how to fix it. A fit that
        logs below the checkpoint's step was not given it: nothing of it is restored."""
        checkpoint = self._resumed_from or resume_checkpoint()
        found = sorted(Path(checkpoint.path).rglob("*.ckpt")) if checkpoint is not None else []
        if len(found) != 1:  # not resuming, or not from a Lightning checkpoint (resume_ckpt_path refuses it)
            return
        holds = read_parts(found[0]) or ["model", "optimizer"]
        if step is not None and step < checkpoint.step:
            why = "fit did not resume from this checkpoint: pass trainer.fit(..., ckpt_path=resume_ckpt_path(logger))"
            report_loaded(checkpoint.path, step=checkpoint.step, holds=holds, not_loaded=dict.fromkeys(holds, why))
            return
        not_loaded = dict.fromkeys((*RNG_PARTS, "data_position"), WITHOUT_RESUME)
        if report_loaded(checkpoint.path, step=checkpoint.step, holds=holds, not_loaded=not_loaded) is not None:
            logger.warning(
                "mado: WARNING: run %s resumed from checkpoint %s through MadoLogger without MadoResume: the random "
                "number generators and the data position are not restored, so it will not continue as an "
                "uninterrupted run would. Add MadoResume() to Trainer(callbacks=[...]) (and a ResumableDataLoader "
                "for a position within an epoch)",
                self.version,
                checkpoint.id,
            )

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback) -> None:
        """Turn the file ``checkpoint_callback`` (a ``ModelCheckpoint``) just saved into a Checkpoint at the global
        step it was saved at, uploaded in the background."""
        path = getattr(checkpoint_callback, "_last_checkpoint_saved", "") or ""
        step = getattr(checkpoint_callback, "_last_global_step_saved", None)
        if not path or step is None or not isinstance(step, int):
            self._warn_once(
                "no-path", "mado: a ModelCheckpoint save without a known file or global step is not recorded"
            )
            return
        if step in self._saved or os.path.islink(path):
            return  # the same state again (last.ckpt, a second ModelCheckpoint, a link)
        if not os.path.isfile(path):
            self._warn_once(
                "not-local", f"mado: {path} is not a local file; checkpoints on remote storage are not recorded"
            )
            return
        includes_optimizer = not getattr(checkpoint_callback, "save_weights_only", False)
        self.save_file(path, step, includes_optimizer=includes_optimizer, wait=False)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """End the Run: ``"success"`` → ``finished``, ``"failed"`` → ``failed`` (the server keeps ``preempted``
        after a stop signal); only a Run this logger finishes (see the class docstring)."""
        final = FINAL_STATUSES.get(status)
        if final is None or not self._finish_run or self._run is None or self._finalized:
            return
        self._finalized = True
        if final == "finished":
            self._run.finish(final)  # a background checkpoint upload that failed raises here: the fit did not succeed
            return
        try:
            self._run.finish(final)
        except MadoError as error:  # the fit already failed; its own exception is the one to see
            logger.error("mado: finishing run %s: %s", self._run.external_id, error)

    # -- checkpoints ------------------------------------------------------------------------------------------

    def save_file(self, path, step: int, *, includes_optimizer: bool, wait: bool, metadata: dict | None = None):
        """Log the Lightning checkpoint file ``path`` as the Run's Checkpoint at ``step`` (global step): hard-linked
        (else copied) into a directory of its own, ``run.log_checkpoint(..., framework="lightning",
        metadata={"training_state": ..., **metadata})``, the directory removed once the save snapshotted it.

        Returns the ``SavedCheckpoint`` (``wait=True``), a ``Future`` of it (``wait=False``), the earlier save's
        when this process already saved ``step``, or None when mado refused the save (logged as an error:
        training goes on; e.g. a step this Run already holds from an earlier start).
        """
        if step in self._saved:
            return self._saved[step]
        path = Path(path)
        try:  # next to the file, so a hard link reaches it
            directory = Path(tempfile.mkdtemp(prefix=f".mado-step-{step}-", dir=path.parent))
        except OSError:
            directory = Path(tempfile.mkdtemp(prefix=f"mado-step-{step}-"))
        try:
            target = directory / path.name
            try:
                os.link(path, target)
            except OSError:  # another file system, or links not allowed
                shutil.copyfile(path, target)
            state = {"training_state": self.training_state(path, step, includes_optimizer), **(metadata or {})}
            try:
                saved = self.run.log_checkpoint(
                    directory, step, includes_optimizer, FRAMEWORK, wait=wait, metadata=state
                )
            except MadoError as error:
                logger.error("mado: checkpoint %s at step %d not recorded: %s", path, step, error)
                return None
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        self._saved[step] = saved
        return saved

    def training_state(self, path, step: int, includes_optimizer: bool) -> dict:
        """``{"parts": {part: {"file": <name>}}, "global_step": step}``: what the Lightning checkpoint file ``path``
        holds (docs/design/checkpoints.md#metadata), as ``MadoResume`` saw it written, else as ``read_parts`` finds
        it in the file, else the model and (``includes_optimizer``) the optimizer."""
        parts = self.companion.parts_at(step) if self.companion is not None else None
        if parts is None:
            parts = read_parts(path) or (["model", "optimizer"] if includes_optimizer else ["model"])
        return {"parts": {part: {"file": Path(path).name} for part in parts}, "global_step": step}

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)


_MISSING = object()


def checkpoint_parts(checkpoint: Mapping) -> list[str]:
    """The parts of the training state a Lightning checkpoint dict holds (docs/design/checkpoints.md#metadata):
    ``model`` (``state_dict``), ``optimizer``, ``scheduler`` (``lr_schedulers``), ``scaler`` (a precision plugin's
    state), ``rng.<name>`` for each RNG in ``MadoResume``'s state, and ``data_position`` (a stateful loader's state
    in the fit loop)."""
    parts = ["model"] if checkpoint.get("state_dict") else []
    if checkpoint.get("optimizer_states"):
        parts.append("optimizer")
    if checkpoint.get("lr_schedulers"):
        parts.append("scheduler")
    if any(str(key).endswith("Precision") and value for key, value in checkpoint.items()):
        parts.append("scaler")  # a precision plugin's state: the AMP gradient scaler
    callbacks = checkpoint.get("callbacks") or {}
    mine = next((state for key, state in callbacks.items() if str(key).startswith(RESUME_CALLBACK)), None) or {}
    parts.extend(f"rng.{name}" for name in sorted(mine.get("rng") or {}))
    fit_loop = ((checkpoint.get("loops") or {}).get("fit_loop") or {}).get("state_dict") or {}
    if fit_loop.get("combined_loader"):
        parts.append("data_position")
    return parts


def read_parts(path) -> list[str] | None:
    """``checkpoint_parts`` of the Lightning checkpoint file ``path``, read without loading its tensors
    (``torch.load(mmap=True, weights_only=True)``); None when it cannot be read so (an object ``weights_only``
    refuses among the hyperparameters, not a zip file)."""
    import pickle
    import zipfile

    import torch

    try:
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except (OSError, RuntimeError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        logger.debug("mado: %s: its parts are not read (%s)", path, error)
        return None
    return checkpoint_parts(checkpoint) if isinstance(checkpoint, Mapping) else None


def _canonical(value) -> str:
    if value is _MISSING:
        return "\0missing"
    return json.dumps(value, sort_keys=True, default=str)


def _number(value):
    if hasattr(value, "item"):
        value = value.item()
    return value
