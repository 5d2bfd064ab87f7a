"""The restore report of a run a framework integration resumed: what the checkpoint holds and what the framework
loaded of it (docs/integrations.md, "What a resume restored"; docs/design/checkpoints.md#restore-check).

``MadoCallback`` (Hugging Face Trainer), ``MadoResume`` / ``MadoLogger`` (Lightning) and
``mado_tracking.integrations.accelerate.load_state`` each call ``report_loaded`` once the framework has loaded
the checkpoint, with the parts the checkpoint holds and those the framework did not load (each with the one
line that says how to load it). The framework's own files carry no fingerprint, so a part is ``restored``
because the framework loaded it from the checkpoint, not because its digest was compared; the first
metrics still check that the loop did not restart its count (``global_step``). The report then goes
through ``mado_tracking.restore_check.after_load``: a WARNING line per part not restored or not declared,
and ``POST runs/{id}/restore-report/`` from a resuming process (a Job's resume or a same-run resume), so
the server does not flag the run "Resume ignored?".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from mado_tracking import restore_check
from mado_tracking.restore_check import NOT_DECLARED, NOT_RESTORED, RESTORED, RestoreCheck
from mado_tracking.torch_restore import global_step_check

# the part names a restore report may hold (the server's rule, docs/design/resume.md#restore-report)
REPORTED = re.compile(
    r"(?:model|optimizer|scheduler|scaler)(?:\.[0-9]{1,3})?|rng\.(?:python|numpy|torch)|rng\.cuda\.[0-9]{1,4}"
    r"|generator\.[A-Za-z0-9_.-]{1,100}|data_position|global_step"
)


def report_loaded(
    directory,
    *,
    step: int,
    holds: Iterable[str],
    not_loaded: Mapping[str, str] | None = None,
    declare_position: str = "",
) -> RestoreCheck | None:
    """Report what a framework restored from the checkpoint in ``directory`` at global ``step`` (module docstring).

    ``holds``: the parts the checkpoint holds, as its ``training_state`` metadata names them (``rng.cuda`` stands
    for every CUDA device here; a part a report cannot name, such as Accelerate's ``registered.<n>``, is left
    out). ``not_loaded``: ``{part: one line saying why and how to load it}`` for the parts the framework did not
    restore, held or not (a Lightning checkpoint without ``MadoResume`` holds no RNG state). Every other held
    part is ``restored``, and so is ``global_step`` (until the first metrics come below ``step``). A
    ``data_position`` neither held nor in ``not_loaded`` is ``not_declared``, its detail ``declare_position``
    (the call that records it).

    Returns the check (``mado_tracking.restore_check.RestoreCheck``), or None when this process is not resuming
    from ``directory``. Never raises for the server (a report that cannot be sent is a warning).
    """
    parts = {part: (RESTORED, "") for part in holds}
    parts.update({part: (NOT_RESTORED, detail) for part, detail in (not_loaded or {}).items()})
    parts.setdefault("global_step", (RESTORED, ""))
    parts.setdefault("data_position", (NOT_DECLARED, declare_position))
    reportable = {
        name: outcome for part, outcome in parts.items() for name in _cuda_parts(part) if REPORTED.fullmatch(name)
    }
    return restore_check.after_load(directory=directory, step=step, parts=reportable, late=[global_step_check(step)])


def _cuda_parts(part: str) -> list[str]:
    """``rng.cuda`` as ``rng.cuda.<device>`` for each CUDA device here (``rng.cuda.0`` without CUDA); else the part."""
    if part != "rng.cuda":
        return [part]
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 1
    return [f"rng.cuda.{index}" for index in range(max(count, 1))]
