"""The MLflow artifact layouts that form checkpoints: artifact path → (step, path inside the checkpoint, framework)
(docs/design/checkpoints.md#mlflow-checkpoints).

One entry per layout a stock client writes (``LAYOUTS``); N is the checkpoint's step:

- ``step-folder``: a Run's ``checkpoints/step-<N>/<file>`` (``mlflow.log_artifacts(dir,
  "checkpoints/step-N")``); the checkpoint's file is ``<file>``; complete when the Run ends or a
  higher step starts; a file its step can no longer take is refused.
- ``transformers``: ``artifacts/checkpoint-<N>/<file>`` of a logged model named ``checkpoint-<N>``
  (``MLflowCallback`` with ``HF_MLFLOW_LOG_ARTIFACTS=1``); the file is ``<file>``, so the checkpoint
  is HF's ``checkpoint-N`` directory; complete when the logged model is finalized READY, and only
  then (the Run's end or a higher step ends it ``error``); the model's own files (``MLmodel``,
  ``python_model.pkl``, …) stay plain.
- ``lightning``: a Run's ``<stem>/<stem>.ckpt`` whose ``<stem>`` holds one ``step=<N>`` between
  ``-`` (``MLFlowLogger(log_model=...)``); the file is ``<stem>.ckpt``, complete once stored;
  ``metadata.yaml`` and ``aliases.txt`` beside it stay plain.

Nothing here touches the database: the caller checks the Run's kind and
decides. A step is a decimal integer of at most 18 digits without a sign;
HF writes ``checkpoint-<N>`` without leading zeros, so ``checkpoint-05`` is
not a checkpoint; Lightning's ``{step:05d}`` pads, so ``step=00005`` is step
5. Anything else (a sign, more digits, two ``step=`` tokens, a stem that
differs from the file's) is a plain artifact. Paths reach this module
already checked (no ``..``, no empty segment, no control character).
"""

import re
from dataclasses import dataclass
from enum import StrEnum


class Completion(StrEnum):
    """What makes a pending checkpoint of a layout complete."""

    RUN_END = "run_end"  # only the Run's end or a higher step
    MODEL_READY = "model_ready"  # the logged model holding the files is finalized READY, and nothing else
    FILE_STORED = "file_stored"  # the checkpoint is one file: complete once it is stored


@dataclass(frozen=True)
class Layout:
    """One recognised layout. ``strict``: a file whose step can no longer take files is refused (409); otherwise
    it is kept as a plain artifact, so a stock client that saves the same step twice keeps training."""

    name: str
    framework: str
    strict: bool
    completes: Completion


@dataclass(frozen=True)
class CheckpointFile:
    """An artifact recognised as file ``path`` (relative, inside the checkpoint) of the checkpoint at ``step``."""

    layout: Layout
    step: int
    path: str

    @property
    def optimizer(self) -> bool:
        """Whether this file is the optimizer state (HF's ``optimizer.pt`` / ``optimizer.bin``)."""
        return self.layout.framework == "transformers" and self.path in ("optimizer.pt", "optimizer.bin")


STEP_FOLDER = Layout("step-folder", framework="", strict=True, completes=Completion.RUN_END)
TRANSFORMERS = Layout("transformers", framework="transformers", strict=False, completes=Completion.MODEL_READY)
LIGHTNING = Layout("lightning", framework="lightning", strict=False, completes=Completion.FILE_STORED)

STEP_MAX_DIGITS = 18  # below 2**63: a step always fits the database's bigint
_STEP = rf"(0|[1-9][0-9]{{0,{STEP_MAX_DIGITS - 1}}})"
_STEP_FOLDER = re.compile(rf"^checkpoints/step-{_STEP}/(.+)$")
_TRANSFORMERS = re.compile(rf"^artifacts/(checkpoint-{_STEP})/(.+)$")
_LIGHTNING_FILE = re.compile(r"^([^/]+)/([^/]+)\.ckpt$")
_LIGHTNING_STEP = re.compile(r"(?:^|-)step=([0-9]+)(?=-|$)")


def _step_folder(path: str, model_name: str | None) -> CheckpointFile | None:
    match = _STEP_FOLDER.match(path) if model_name is None else None
    return CheckpointFile(STEP_FOLDER, int(match.group(1)), match.group(2)) if match else None


def _transformers(path: str, model_name: str | None) -> CheckpointFile | None:
    """``MLflowCallback.on_save``: ``pyfunc.log_model("checkpoint-N", artifacts={"model_path": <dir>})`` puts the
    directory at ``artifacts/checkpoint-N/`` of a logged model named ``checkpoint-N``."""
    match = _TRANSFORMERS.match(path) if model_name is not None else None
    if match is None or match.group(1) != model_name:
        return None
    return CheckpointFile(TRANSFORMERS, int(match.group(2)), match.group(3))


def _lightning(path: str, model_name: str | None) -> CheckpointFile | None:
    """``MLFlowLogger._scan_and_log_checkpoints``: ``log_artifact(run_id, <dir>/<stem>.ckpt, <stem>)``; the step is
    the ``step=N`` that ``ModelCheckpoint``'s file name carries (``epoch=0-step=5``, ``epoch=0-step=5-v1``)."""
    match = _LIGHTNING_FILE.match(path) if model_name is None else None
    if match is None or match.group(1) != match.group(2):
        return None
    steps = _LIGHTNING_STEP.findall(match.group(1))
    if len(steps) != 1 or len(steps[0]) > STEP_MAX_DIGITS:
        return None
    return CheckpointFile(LIGHTNING, int(steps[0]), f"{match.group(2)}.ckpt")


LAYOUTS = (STEP_FOLDER, TRANSFORMERS, LIGHTNING)
_MATCHERS = (_step_folder, _transformers, _lightning)


def checkpoint_file_in(path: str, *, model_name: str | None = None) -> CheckpointFile | None:
    """The checkpoint file that artifact ``path`` is under one of ``LAYOUTS``, else None (a plain artifact).

    ``path``: a checked artifact path, relative to the Run's artifact root, or
    to the logged model's when ``model_name`` (the logged model's name) is
    given. The first layout that matches wins; at most one can.
    """
    for match in _MATCHERS:
        found = match(path, model_name)
        if found is not None:
            return found
    return None
