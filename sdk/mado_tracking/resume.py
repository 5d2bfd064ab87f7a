"""The checkpoint a resumed run starts from (docs/design/worker.md#extract; docs/design/resume.md#in-the-code), read
from the ``MMT_RESUME_*`` variables.

The worker extracts the checkpoint read-only and starts the training code with
``MMT_RESUME_CHECKPOINT_DIR`` (the extracted directory), ``MMT_RESUME_STEP``
and ``MMT_RESUME_CHECKPOINT_FILE`` (``resume-checkpoint.json``:
``{"checkpointId", "sourceRunId", "step", …}``). Locally the same three
variables resume from any directory, e.g. an offline run's
``checkpoints/step-20``. ``run.resume_checkpoint()`` reads them first; without
them, a Run resumed under its id fetches its latest checkpoint
(``mado_tracking.resume_fetch``).
"""

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from mado_tracking.errors import ResumeError

ENV_DIR = "MMT_RESUME_CHECKPOINT_DIR"
ENV_STEP = "MMT_RESUME_STEP"
ENV_FILE = "MMT_RESUME_CHECKPOINT_FILE"
ENV_NAMES = (ENV_DIR, ENV_STEP, ENV_FILE)


@dataclass(frozen=True)
class ResumeCheckpoint:
    """The checkpoint to resume from: ``path`` (its directory, read-only), ``step`` (steps completed:
    continue with ``range(step, total)``), ``id`` (the checkpoint's id), ``source_run_id`` (the Run that
    saved it) and ``info`` (the whole ``resume-checkpoint.json`` object)."""

    path: Path
    step: int
    id: object
    source_run_id: object
    info: dict = field(default_factory=dict, repr=False, compare=False)


def resume_checkpoint() -> ResumeCheckpoint | None:
    """The checkpoint this process resumes from, or None when it is not resuming (docs/design/resume.md#in-the-code).

    None when none of ``MMT_RESUME_CHECKPOINT_DIR``, ``MMT_RESUME_STEP`` and
    ``MMT_RESUME_CHECKPOINT_FILE`` is set (empty counts as unset). Usable
    before ``start_run`` and without a server.

    Raises:
        ResumeError: only some of the three are set; ``MMT_RESUME_STEP`` is
            not an int >= 0; the directory or the JSON file is missing or
            unreadable; the file is not a JSON object with an int ``step``;
            or its ``step`` differs from ``MMT_RESUME_STEP``. The message
            names the variable and the value.
    """
    values = {name: os.environ.get(name, "").strip() for name in ENV_NAMES}
    if not any(values.values()):
        return None
    missing = [name for name, value in values.items() if not value]
    if missing:
        given = ", ".join(f"{name}={value}" for name, value in values.items() if value)
        raise ResumeError(
            f"resuming needs {', '.join(ENV_NAMES)} together; {', '.join(missing)} not set (given: {given})"
        )
    try:
        step = int(values[ENV_STEP])
    except ValueError:
        step = -1
    if step < 0:
        raise ResumeError(f"{ENV_STEP} must be an int >= 0 (steps completed), got {values[ENV_STEP]!r}")
    path = Path(values[ENV_DIR])
    if not path.is_dir():
        raise ResumeError(f"{ENV_DIR}={path}: not a directory")
    info = _read_info(Path(values[ENV_FILE]))
    if info["step"] != step:
        raise ResumeError(
            f"{ENV_STEP}={step} but {values[ENV_FILE]} says step {info['step']}: the variables "
            "do not describe the same checkpoint"
        )
    return ResumeCheckpoint(
        path=path, step=step, id=info.get("checkpointId"), source_run_id=info.get("sourceRunId"), info=info
    )


def _read_info(path: Path) -> dict:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ResumeError(f"{ENV_FILE}={path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ResumeError(f"{ENV_FILE}={path}: not valid JSON ({exc})") from None
    if not isinstance(info, dict):
        raise ResumeError(f"{ENV_FILE}={path}: must hold a JSON object {{checkpointId, sourceRunId, step}}")
    step = info.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise ResumeError(f'{ENV_FILE}={path}: "step" must be an int, got {step!r}')
    return info
