"""Declared changes in a resumed Run's verdict: a parameter changed on purpose and whether it took effect
(docs/design/resume.md#declared-changes).

Pure functions, no database: the changes come as ``(key, old, new)``, the verdict's blocks as the first step each
compared metric key diverged at (None: never), the restore report as its parts and details. A change of a number is
checked against what the change should touch, in this order:

- a metric the Run logs under the parameter's name (``train.lr`` for ``lr``; ``lr`` and ``learning_rate`` are
  one name): it diverged from the parent's at step k → the change took effect at step k; it stayed the parent's →
  the optimizer still ran at the old value;
- else, for a learning rate, the restore report: the optimizer's detail ``param group 0: lr X at the load, Y at
  the first optimizer step`` shows which rate the first step ran at; an optimizer ``restored`` with nothing set
  after the load ran at the checkpoint's rate, the old one;
- else nothing can tell: the change is listed, not judged.

A data stage from the checkpoint's step on (the continue's changed data mix, or a stage the program recorded) is a
declared change of ``data`` (its datasets before and after, ``name:version``) that took effect at its first step.

Who put the old value back is named from the report: a restored scheduler, else the restored optimizer state.
"""

import math
import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple

_ALIASES = {"learning_rate": "lr"}
_LEARNING_RATE = "lr"
_AT_FIRST_STEP = re.compile(r"param group \d+: lr (\S+) at the load, (\S+) at ")
_SAME = 1e-9  # relative: a float logged as float32 and read back still counts as the value set
RESTORED = "restored"
SCHEDULER, OPTIMIZER = "scheduler", "optimizer"


class DeclaredChange(NamedTuple):
    """One parameter changed on purpose by the resume or continue that started the Run.

    ``took_effect_at_step``: the first step the change shows (None: not
    seen); ``overridden``: the optimizer still ran at ``old_value``;
    ``overridden_by``: ``"scheduler"``, ``"optimizer"`` or ``""`` (not
    named); ``evidence``: the metric key that shows it, ``"restore_report"``,
    or ``""`` when nothing could tell.
    """

    key: str
    old_value: object
    new_value: object
    took_effect_at_step: int | None
    overridden: bool
    overridden_by: str
    evidence: str


class DeclaredVerdict(NamedTuple):
    """The declared changes of a verdict and whether its divergence is theirs: ``divergence_declared`` True when the
    Run diverged at or after the first step a declared change took effect (else a divergence is still one)."""

    changes: list[DeclaredChange]
    divergence_declared: bool


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= _SAME * max(abs(a), abs(b))


def _name(key: str) -> str:
    """A parameter's or metric's last name (after ``.`` or ``/``), aliases folded: ``train.learning_rate`` → ``lr``."""
    leaf = re.split(r"[./]", key)[-1]
    return _ALIASES.get(leaf, leaf)


def _overrider(parts: Mapping[str, str]) -> str:
    if parts.get(SCHEDULER) == RESTORED:
        return SCHEDULER
    return OPTIMIZER if parts.get(OPTIMIZER) == RESTORED else ""


def _from_report(
    old: float, new: float, parts: Mapping[str, str], details: Mapping[str, str], first_step: int | None
) -> tuple[int | None, bool, str]:
    """``(took_effect_at_step, overridden, evidence)`` of a learning-rate change from the restore report."""
    found = _AT_FIRST_STEP.search(details.get(OPTIMIZER, ""))
    if found:
        try:
            at_step = float(found.group(2))
        except ValueError:
            at_step = math.nan
        if _same(at_step, new):
            return first_step, False, "restore_report"
        if _same(at_step, old):
            return None, True, "restore_report"
    elif parts.get(OPTIMIZER) == RESTORED:
        return None, True, "restore_report"
    return None, False, ""


DATA = "data"


def declared_verdict(
    *,
    changes: Iterable[tuple[str, object, object]],
    data: Iterable[tuple[int, list[str], list[str]]] = (),
    diverged_at: Mapping[str, int | None],
    parts: Mapping[str, str],
    details: Mapping[str, str],
    first_step: int | None,
    diverged_step: int | None,
) -> DeclaredVerdict:
    """Judge each declared ``(key, old, new)`` change (module docstring); each data stage of ``data``,
    ``(start_step, datasets before, datasets after)``, is a change of ``data`` that took effect at its first step.

    ``diverged_at``: each compared metric key → the first step it diverged
    at (None: never); ``parts`` / ``details``: the restore report's (empty:
    none); ``first_step``: the Run's first logged step (an int; None before
    its first metrics); ``diverged_step``: the verdict's step when it is
    ``diverged``, else None.
    """
    judged = []
    for key, old, new in changes:
        before, after = _number(old), _number(new)
        step, overridden, evidence = None, False, ""
        if before is not None and after is not None:
            metrics = sorted(metric for metric in diverged_at if _name(metric) == _name(key))
            if metrics:
                evidence = metrics[0]
                step = diverged_at[evidence]
                overridden = step is None
            elif _name(key) == _LEARNING_RATE:
                step, overridden, evidence = _from_report(before, after, parts, details, first_step)
        judged.append(
            DeclaredChange(key, old, new, step, overridden, _overrider(parts) if overridden else "", evidence)
        )
    judged += [DeclaredChange(DATA, before, after, step, False, "", "data_stage") for step, before, after in data]
    effects = [change.took_effect_at_step for change in judged if change.took_effect_at_step is not None]
    declared = diverged_step is not None and bool(effects) and diverged_step >= min(effects)
    return DeclaredVerdict(judged, declared)
