"""The parity of two runs' curves over the steps both logged, as the server's verdict reads
(docs/design/checkpoints.md#probe): ``mado probe-resume`` compares a resumed run with an uninterrupted one the same way.

Per key both runs have (``system/…`` keys aside: they measure the machine),
on each step both logged from ``from_step`` on: ``identical`` when every
value is the same bit for bit (NaN equals NaN), ``within_tolerance`` when
every pair is within the relative tolerance (``|a - b| <= tolerance *
max(|a|, |b|)``), ``diverged`` at the first step where a pair is not (the
key, both values), ``unknown`` when no step is compared.
"""

import math
from collections.abc import Mapping

DEFAULT_TOLERANCE = 1e-6
VERDICTS = ("identical", "within_tolerance", "unknown", "diverged")  # from best to worst
SYSTEM_PREFIX = "system/"

Series = Mapping[str, Mapping[int, float | None]]  # key → {step: value}


def _number(value) -> float | None:
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _close(a: float, b: float, tolerance: float) -> bool:
    if not (math.isfinite(a) and math.isfinite(b)):
        return _same(a, b)
    return abs(a - b) <= tolerance * max(abs(a), abs(b))


def compare(reference: Series, other: Series, *, from_step: int, tolerance: float = DEFAULT_TOLERANCE) -> dict:
    """The verdict of ``other`` against ``reference`` (module docstring).

    Args:
        reference, other: ``{key: {step: value}}``; a value of None is NaN (how
            the API writes a non-finite value), a value that is not a number
            makes its pair differ.
        from_step: the first step compared (the checkpoint's step).
        tolerance: relative, >= 0.

    Returns:
        ``{"verdict", "step", "key", "parent_value", "child_value",
        "tolerance", "compared_steps", "compared_keys"}`` (the keys, sorted):
        ``step`` / ``key`` / values name the first divergence (None otherwise).
    """
    if not (isinstance(tolerance, (int, float)) and tolerance >= 0):
        raise ValueError(f"tolerance must be a number >= 0, got {tolerance!r}")
    keys = sorted(key for key in set(reference) & set(other) if not key.startswith(SYSTEM_PREFIX))
    steps, first, exact = set(), None, True
    for key in keys:
        for step in sorted(s for s in set(reference[key]) & set(other[key]) if s >= from_step):
            steps.add(step)
            a, b = _number(reference[key][step]), _number(other[key][step])
            if a is not None and b is not None and _same(a, b):
                continue
            exact = False
            if a is None or b is None or not _close(a, b, tolerance):
                if first is None or step < first[0]:
                    first = (step, key, reference[key][step], other[key][step])
                break
    result = {
        "verdict": "identical",
        "step": None,
        "key": None,
        "parent_value": None,
        "child_value": None,
        "tolerance": tolerance,
        "compared_steps": len(steps),
        "compared_keys": keys,
    }
    if not steps:
        result["verdict"] = "unknown"
    elif first is not None:
        result.update(verdict="diverged", step=first[0], key=first[1], parent_value=first[2], child_value=first[3])
    elif not exact:
        result["verdict"] = "within_tolerance"
    return result


def describe(parity: Mapping | None, parent: str = "parent", child: str = "child") -> str:
    """One line for a verdict: ``identical (7 steps, 2 keys)``, ``diverged at step 21: train.loss 0.52 (parent) vs
    0.57 (child)``, …; ``no verdict`` for None."""
    if not parity or not parity.get("verdict"):
        return "no verdict"
    verdict = parity["verdict"]
    keys = parity.get("compared_keys")
    counted = f"{parity.get('compared_steps', 0)} steps, {len(keys) if isinstance(keys, list) else keys or 0} keys"
    if verdict == "diverged":
        return (
            f"diverged at step {parity.get('step')}: {parity.get('key')} {parity.get('parent_value')!r} ({parent}) "
            f"vs {parity.get('child_value')!r} ({child})"
        )
    if verdict == "within_tolerance":
        return f"within tolerance {parity.get('tolerance')!r} ({counted})"
    if verdict == "unknown":
        return "unknown: no step logged by both after the checkpoint"
    return f"{verdict} ({counted})"
