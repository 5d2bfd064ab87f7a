"""Hugging Face ``Trainer`` to mado: a ``TrainerCallback`` that logs the Trainer's metrics, turns each
``checkpoint-N`` directory into a mado Checkpoint at global step N, hands a resumed Job its checkpoint back,
and saves before a preemption (docs/integrations.md; docs/design/checkpoints.md#a-checkpoint, #metadata;
docs/design/resume.md#in-the-code, #steps-continue; docs/design/runs.md#preemption)::

    from mado_tracking.integrations.transformers import MadoCallback, resume_from_checkpoint

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[MadoCallback(project="nlp")])
    trainer.train(resume_from_checkpoint=resume_from_checkpoint(trainer))

``report_to="mado"`` is not offered: transformers has no public way to register a reporter name (its
``INTEGRATION_TO_CALLBACK`` table is a module global), so the callback is passed in ``callbacks=``.

Distributed (torchrun): every rank joins the one Run (``start_run`` under a process group), only the world
process zero logs metrics and checkpoints, every rank calls the collective stop check at each step.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import mado_tracking
from mado_tracking import preemption as preemption_module
from mado_tracking.integrations.restore_report import report_loaded

try:
    from transformers import TrainerCallback
except ImportError as error:  # pragma: no cover - the message is the point
    raise ImportError(
        "mado_tracking.integrations.transformers needs transformers: pip install 'mado-tracking[integrations]'"
    ) from error

logger = logging.getLogger("mado_tracking")

__all__ = ["MadoCallback", "resume_from_checkpoint", "training_parameters", "training_state"]

FRAMEWORK = "transformers"
TRAINER_STATE_FILE = "trainer_state.json"

# TrainingArguments fields that say where output goes or how the console looks, not what is trained: kept out of
# the Run's parameters (a path or a token would also make a same-run resume refuse a "changed" parameter).
SKIPPED_ARGUMENTS = frozenset(
    {
        "output_dir",
        "logging_dir",
        "overwrite_output_dir",
        "run_name",
        "project",
        "report_to",
        "resume_from_checkpoint",
        "local_rank",
        "do_train",
        "do_eval",
        "do_predict",
        "disable_tqdm",
        "log_level",
        "log_level_replica",
        "log_on_each_node",
        "skip_memory_metrics",
        "push_to_hub",
        "push_to_hub_model_id",
        "push_to_hub_organization",
        "push_to_hub_token",
    }
)
SKIPPED_PREFIXES = ("hub_", "trackio_", "_")
# model config keys that are runtime switches or label tables (``model.num_labels`` stands for the latter)
SKIPPED_CONFIG = frozenset(
    {"id2label", "label2id", "output_hidden_states", "output_attentions", "return_dict", "torchscript"}
)
# logs keys HF sends under its own names at the end of training (``train/`` prefix as its W&B and TensorBoard
# callbacks write them)
EVAL_PREFIX, TEST_PREFIX = "eval_", "test_"

# files of a checkpoint-N directory, by part of the training state (docs/design/checkpoints.md#metadata)
MODEL_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)
OPTIMIZER_FILES = ("optimizer.pt", "optimizer.bin")
SCHEDULER_FILE = "scheduler.pt"
SCALER_FILE = "scaler.pt"


def _json_safe(value):
    """``value`` as JSON the server stores: str keys, finite numbers (others as text), lists, dicts; anything else
    as its ``str``."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_json_safe(item) for item in value]
    return str(value)


def training_parameters(args, model=None) -> dict:
    """The Run's parameters for a Trainer: ``args.to_dict()`` and ``model.config.to_dict()`` as one flat, JSON-safe
    dict (docs/integrations.md).

    ``args``: ``TrainingArguments``; ``model``: a ``PreTrainedModel`` or anything with a ``config.to_dict()`` (None
    or no config: the arguments only). Argument names stay as they are (``learning_rate``, ``seed`` …); model config
    keys get a ``model.`` prefix (``model.hidden_size``), and ``model.num_labels`` stands for the label tables.
    Left out: None values, ``SKIPPED_ARGUMENTS`` (paths, hub, reporting and console settings), ``hub_*`` and
    private keys, the config's runtime switches. Values that are not JSON (an enum, a dtype, NaN) become text.
    """
    parameters = {}
    for key, value in args.to_dict().items():
        if value is None or key in SKIPPED_ARGUMENTS or key.startswith(SKIPPED_PREFIXES):
            continue
        parameters[key] = _json_safe(value)
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        values = config.to_dict()
        if isinstance(values.get("id2label"), dict):
            parameters["model.num_labels"] = len(values["id2label"])
        for key, value in values.items():
            if value is None or key in SKIPPED_CONFIG or key.startswith("_"):
                continue
            parameters[f"model.{key}"] = _json_safe(value)
    return parameters


def training_state(directory: str | os.PathLike, global_step: int) -> dict:
    """``{"training_state": {"parts": {...}, "global_step": N}}``: what a Trainer ``checkpoint-N`` directory holds,
    by the files really there (docs/design/checkpoints.md#metadata).

    Parts: ``model`` (the weights file or its index), ``optimizer``, ``scheduler``, ``scaler``, ``rng.python``,
    ``rng.numpy``, ``rng.torch`` (and ``rng.cuda`` when CUDA is available: the Trainer saves it then), all in
    ``rng_state.pth``, and ``data_position`` (``trainer_state.json``: the Trainer skips the batches its
    ``global_step`` says were seen). Each is ``{"file": <relative path>}``; a distributed run's per-process RNG
    files give ``{"files": [...]}``.
    """
    directory = Path(directory)
    parts: dict[str, dict] = {}
    for part, names in (("model", MODEL_FILES), ("optimizer", OPTIMIZER_FILES), ("scheduler", (SCHEDULER_FILE,))):
        found = next((name for name in names if (directory / name).is_file()), None)
        if found:
            parts[part] = {"file": found}
    if (directory / SCALER_FILE).is_file():
        parts["scaler"] = {"file": SCALER_FILE}
    rng = {"file": "rng_state.pth"} if (directory / "rng_state.pth").is_file() else None
    if rng is None:
        per_process = sorted(path.name for path in directory.glob("rng_state_*.pth"))
        rng = {"files": per_process} if per_process else None
    if rng is not None:
        generators = ["python", "numpy", "torch"] + (["cuda"] if _cuda_available() else [])
        parts.update({f"rng.{name}": dict(rng) for name in generators})
    if (directory / TRAINER_STATE_FILE).is_file():
        parts["data_position"] = {"file": TRAINER_STATE_FILE}
    return {"training_state": {"parts": parts, "global_step": int(global_step)}}


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _metric_key(key: str) -> str:
    """HF's log name as mado's metric key: ``eval_loss`` → ``eval/loss``, ``test_x`` → ``test/x``, else
    ``train/<name>`` (``loss`` → ``train/loss``), as HF's W&B and TensorBoard callbacks name them."""
    if key.startswith(EVAL_PREFIX):
        return "eval/" + key[len(EVAL_PREFIX) :]
    if key.startswith(TEST_PREFIX):
        return "test/" + key[len(TEST_PREFIX) :]
    return "train/" + key


def _distributed():
    """``torch.distributed`` when a process group of more than one process is initialised, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


def _barrier() -> None:
    dist = _distributed()
    if dist is not None:
        dist.barrier()


class MadoCallback(TrainerCallback):
    """A ``TrainerCallback`` that records a Trainer's training in a mado Run (docs/integrations.md).

    ``MadoCallback(run=None, project=None, name=None, *, kind="training", parameters=None, checkpoints=True,
    preemption=True, **start_options)``:

    - ``run``: a Run you started (``mado_tracking.start_run``); you finish it. None: the callback starts one when
      training begins (or at ``resume_from_checkpoint(trainer)``, or at the first log) with ``project``, ``name``,
      ``kind`` (``"training"``, or ``"fine_tuning"`` …), the parameters of ``training_parameters(args, model)``
      updated by ``parameters``, and ``start_options`` passed on to ``start_run`` (``id``, ``resume``,
      ``offline``, ``output`` …). Inside a Job it joins the Job's Run. It is finished when the interpreter exits
      (``callback.run.finish()`` sooner), so ``trainer.evaluate()`` after training still logs into it.
    - Metrics: each ``on_log`` at ``state.global_step``, numeric values only, named as HF's W&B and TensorBoard
      callbacks name them: ``train/loss``, ``train/learning_rate``, ``train/grad_norm``, ``train/epoch``,
      ``eval/loss``, ``test/…``.
    - ``checkpoints``: each ``checkpoint-N`` the Trainer saves under ``args.output_dir`` becomes the Run's
      Checkpoint at step N (``framework="transformers"``, ``includes_optimizer`` when ``optimizer.pt`` is there,
      ``metadata`` from ``training_state``); the Trainer waits only for a snapshot of the files (``wait=False``),
      the upload goes on in the background and the Run's finish waits for it.
    - ``preemption``: on SIGTERM or SIGUSR1 (``mado_tracking.preemption``) the Trainer saves at the next step end and
      stops; that checkpoint is uploaded before the callback exits the process with 128 + the signal number, and
      the Run ends ``preempted`` (docs/design/runs.md#preemption).

    Only the world process zero logs; under torchrun every rank joins the Run and calls the collective stop check
    at each step end, and every rank waits at ``on_save`` until each one wrote its files.

    Raises ``ValueError`` at construction for an unknown ``kind`` or ``run`` given with start arguments.
    """

    def __init__(
        self,
        run=None,
        project: str | None = None,
        name: str | None = None,
        *,
        kind: str = "training",
        parameters: dict | None = None,
        checkpoints: bool = True,
        preemption: bool = True,
        **start_options,
    ):
        from mado_tracking._base import check_kind

        check_kind(kind)
        if run is not None and (project is not None or name is not None or parameters or start_options):
            given = ", ".join(
                key
                for key, value in {"project": project, "name": name, "parameters": parameters, **start_options}.items()
                if value
            )
            raise ValueError(f"MadoCallback: run is already started; {given} belong to start_run, not here")
        self.run = run
        self.checkpoints = checkpoints
        self.preemption = preemption
        self._start = {"project": project, "name": name, "kind": kind, "parameters": parameters, **start_options}
        self._stop = None
        self._stopping = False
        self._warned: set[str] = set()
        self._resuming: tuple[str, int] | None = None  # (directory, step) handed to trainer.train, until reported

    # -- the Run ---------------------------------------------------------------------------------------------------

    def setup(self, args, state=None, model=None):
        """Start the Run if none yet (every rank under torchrun: ``start_run`` is collective there); return it.

        ``args``: ``TrainingArguments``; ``model``: for ``training_parameters``; ``state`` is unused (the Trainer's
        callback signature). Called by ``on_train_begin``, ``on_log`` and ``resume_from_checkpoint``; calling it
        again does nothing. Raises what ``start_run`` raises.
        """
        if self.run is None:
            start = dict(self._start)
            start["parameters"] = {**training_parameters(args, model), **(start.get("parameters") or {})}
            self.run = mado_tracking.start_run(**start)
        return self.run

    def resume_from_checkpoint(self, trainer=None) -> str | None:
        """The directory to pass to ``trainer.train(resume_from_checkpoint=...)``, or None to start afresh
        (docs/design/resume.md#in-the-code).

        With ``trainer`` the Run is started first (parameters from ``trainer.args`` and ``trainer.model``), so a
        same-run resume finds the Run's latest complete checkpoint through ``run.resume_checkpoint()``; a resumed
        Job's checkpoint comes from the ``MMT_RESUME_*`` variables either way. The directory may be read-only: the
        Trainer only reads it. Raises ``ResumeError`` when the checkpoint is not a Trainer checkpoint or its
        ``trainer_state.json`` names another global step.
        """
        if trainer is not None:
            self.setup(trainer.args, getattr(trainer, "state", None), getattr(trainer, "model", None))
        checkpoint = self.run.resume_checkpoint() if self.run is not None else mado_tracking.resume_checkpoint()
        directory = _trainer_directory(checkpoint)
        self._resuming = None if directory is None else (directory, checkpoint.step)
        return directory

    # -- Trainer events --------------------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        """Start the Run (``setup``), send the restore report of the checkpoint ``resume_from_checkpoint`` handed
        out (``report_restored``) and, with ``preemption``, install the stop-signal handler until training ends (a
        warning instead when the Trainer runs outside the main thread, where no signal arrives)."""
        self.setup(args, state, model)
        if self._resuming is not None and state.is_world_process_zero:
            self.report_restored(args, state)
        # only while training: an evaluation alone has no step end to check the flag at
        if self.preemption and self._stop is None:
            try:
                self._stop = preemption_module.install(self.run)
            except ValueError as error:  # the Trainer runs outside the main thread: signals never reach it
                self._warn("preemption", f"mado: no save on a stop signal: {error}")

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        """Log the numbers of ``logs`` at ``state.global_step`` under ``train/``, ``eval/``, ``test/`` names (world
        process zero only; a value that is not a number is left out with one warning per key)."""
        if not state.is_world_process_zero or not logs:
            return
        self.setup(args, state, model)  # trainer.evaluate() without train()
        metrics = {}
        for key, value in logs.items():
            if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
                value = value.item()  # a one-element tensor or a numpy scalar
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[_metric_key(key)] = value
            else:
                self._warn(f"log:{key}", f"mado: {key!r} is not a number ({type(value).__name__}); not logged")
        if metrics:
            self.run.log_metrics(metrics, step=state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        """Every rank: once any process got a stop signal, have the Trainer save now and stop training."""
        if self._stop is None:
            return
        # every rank at every step end: agreed() is one all-reduce under a process group
        if self._stop.agreed():
            if not self._stopping:
                logger.warning(
                    "mado: %s received: saving checkpoint-%d, then exiting", self._stop.signal_name, state.global_step
                )
            self._stopping = True
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        """Log ``checkpoint-<global_step>`` (world process zero, after every process wrote its files); after a stop
        signal wait until it is complete, then every rank exits with 128 + the signal number."""
        if not (self.checkpoints or self._stopping):
            return
        _barrier()  # each process wrote its own files (rng_state_<k>.pth) before process zero snapshots them
        if not self._stopping:
            if self.checkpoints and state.is_world_process_zero:
                self._log_checkpoint(args, state)
            return
        try:
            if self.checkpoints and state.is_world_process_zero:
                self._log_checkpoint(args, state)
        except Exception as error:  # noqa: BLE001 - the process must stop anyway; say why the save is not there
            logger.error("mado: the checkpoint saved on %s was not uploaded: %s", self._stop.signal_name, error)
        _barrier()  # no rank exits before the upload is complete (torchrun would stop the others)
        self._stop.exit()

    def on_train_end(self, args, state, control, **kwargs):
        """Put back the signal handlers that were there before training (or exit as preempted if stopping)."""
        if self._stop is None:
            return
        if self._stopping:  # the save was skipped (hyperparameter search …): still leave as preempted
            self._stop.exit()
        if self._stop.requested:
            logger.warning("mado: a stop signal came after the last step; training is complete")
        self._stop.uninstall()
        self._stop = None

    # -- helpers ---------------------------------------------------------------------------------------------------

    def report_restored(self, args, state):
        """The restore report of the checkpoint ``resume_from_checkpoint`` handed out, from what the Trainer loaded
        before ``on_train_begin`` (docs/integrations.md, "What a resume restored").

        A Trainer at the checkpoint's global step was given the directory: it loaded the model, optimizer, scheduler
        and scaler there, skips the batches already seen (the data position) unless ``args.ignore_data_skip``, and
        sets the RNGs back from this process's ``rng_state*.pth`` before the first step. At another global step it
        loaded nothing of it. Returns ``mado_tracking.restore_check.RestoreCheck``, or None when not resuming.
        """
        directory, step = self._resuming
        self._resuming = None
        holds = list(training_state(directory, step)["training_state"]["parts"])
        if state.global_step != step:
            why = (
                f"the Trainer started at global step {state.global_step}, not at the checkpoint's {step}: pass "
                "trainer.train(resume_from_checkpoint=resume_from_checkpoint(trainer))"
            )
            return report_loaded(
                directory, step=step, holds=holds, not_loaded=dict.fromkeys([*holds, "global_step"], why)
            )
        not_loaded = {}
        if args.ignore_data_skip:
            not_loaded["data_position"] = (
                "TrainingArguments(ignore_data_skip=True): the resumed epoch starts again at its first batch"
            )
        rng_file = f"rng_state_{args.process_index}.pth" if args.world_size > 1 else "rng_state.pth"
        if not (Path(directory) / rng_file).is_file():
            not_loaded.update(
                dict.fromkeys(
                    (part for part in holds if part.startswith("rng.")),
                    f"the checkpoint has no {rng_file} (saved by another number of processes): the Trainer left "
                    "the RNGs as they were",
                )
            )
        return report_loaded(directory, step=step, holds=holds, not_loaded=not_loaded)

    def _log_checkpoint(self, args, state) -> None:
        step = state.global_step
        directory = Path(args.output_dir) / f"checkpoint-{step}"
        if not directory.is_dir():
            self._warn("missing", f"mado: {directory} not found (a trial's own directory?); checkpoints not logged")
            return
        metadata = training_state(directory, step)
        world_size = getattr(args, "world_size", 1)
        missing = [k for k in range(world_size) if world_size > 1 and not (directory / f"rng_state_{k}.pth").is_file()]
        if missing:
            self._warn(
                "rng",
                f"mado: {directory} lacks rng_state_<k>.pth of process(es) {missing}: args.output_dir is not shared "
                "by all processes, so a resume cannot restore their random state",
            )
        if self._stopping:
            metadata.update(self._stop.metadata())
        parts = metadata["training_state"]["parts"]
        self.run.log_checkpoint(
            directory,
            step=step,
            includes_optimizer="optimizer" in parts,
            framework=FRAMEWORK,
            wait=self._stopping,  # preempted: complete before the process exits
            metadata=metadata,
        )

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)


def resume_from_checkpoint(trainer=None, *, run=None) -> str | None:
    """The directory to pass to ``trainer.train(resume_from_checkpoint=...)``, or None to start afresh
    (docs/design/resume.md#in-the-code; docs/integrations.md).

    ``trainer``: a ``Trainer`` with a ``MadoCallback`` in its callbacks (its Run is started, see
    ``MadoCallback.resume_from_checkpoint``); else ``run``: the Run's ``resume_checkpoint()``; else the
    ``MMT_RESUME_*`` variables of a resumed Job (``mado_tracking.resume_checkpoint()``).

    Raises ``ValueError`` when ``trainer`` has no ``MadoCallback``; ``ResumeError`` when the checkpoint is not a
    Trainer checkpoint (no ``trainer_state.json``) or its global step is not the checkpoint's step.
    """
    if trainer is not None:
        callback = next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, MadoCallback)), None)
        if callback is None:
            raise ValueError("trainer has no MadoCallback: pass Trainer(..., callbacks=[MadoCallback(...)])")
        return callback.resume_from_checkpoint(trainer)
    checkpoint = run.resume_checkpoint() if run is not None else mado_tracking.resume_checkpoint()
    return _trainer_directory(checkpoint)


def _trainer_directory(checkpoint) -> str | None:
    """``checkpoint.path`` as a str once it is a Trainer checkpoint at ``checkpoint.step``; None for None."""
    if checkpoint is None:
        return None
    state_file = Path(checkpoint.path) / TRAINER_STATE_FILE
    try:
        global_step = json.loads(state_file.read_text(encoding="utf-8"))["global_step"]
    except OSError:
        raise mado_tracking.ResumeError(
            f"checkpoint {checkpoint.id} at step {checkpoint.step} ({checkpoint.path}) is not a Hugging Face Trainer "
            f"checkpoint: it has no {TRAINER_STATE_FILE}; resume it with the code that saved it"
        ) from None
    except (ValueError, KeyError, TypeError):
        raise mado_tracking.ResumeError(f"{state_file}: not a Trainer state (a JSON object with global_step)") from None
    if global_step != checkpoint.step:
        raise mado_tracking.ResumeError(
            f"checkpoint {checkpoint.id} is at step {checkpoint.step} but its {TRAINER_STATE_FILE} says global step "
            f"{global_step}: the Trainer would continue at another step than the Run's checkpoint"
        )
    return str(checkpoint.path)
