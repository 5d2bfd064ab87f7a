"""Metric points as ``log_metrics`` checks them, and their JSON forms (docs/api.md).

A point is a ``(key, value, step, timestamp)`` tuple of Python str, float,
int and float (``Point``): the key a non-empty str of at most
``METRIC_KEY_MAX`` characters without NUL, the value any real number (NaN and
±inf included), the step in [0, 2**63), the timestamp Unix seconds. Both
the sender (``mado_tracking.metrics``) and the points kept for a resume
(``mado_tracking.unsent``) build on this module; it imports no other module
of the SDK.
"""

import json
import math
import numbers
from collections.abc import Mapping

STEP_MAX = 2**63 - 1  # the server's BIGINT column
METRIC_KEY_MAX = 250  # the server's column width (runs.models.MetricPoint.key)

_KEYS_SEEN: set[str] = set()  # keys already checked (bounded: a program may make up keys as it goes)
_KEYS_SEEN_MAX = 10_000
_NON_FINITE_TEXT = {math.inf: "Infinity", -math.inf: "-Infinity"}  # and NaN: "NaN" (docs/api.md)

Point = tuple[str, float, int, float]  # key, value, step, timestamp (Unix seconds)


def check_metric_step(step) -> int:
    """``step`` as an int in [0, 2**63) (the server's BIGINT); ``ValueError`` otherwise (numpy integers accepted)."""
    if type(step) is not int:
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        step = int(step)
    if not 0 <= step <= STEP_MAX:
        raise ValueError(f"step must be an int >= 0 and below 2**63, got {step}")
    return step


def metric_points(metrics, step, now: float) -> list[Point]:
    """Validate one ``log_metrics`` call; its points as ``(key, value, step, now)`` tuples.

    ``now`` is Unix seconds. Raises ``ValueError`` for a bad step, key or
    value (naming the key) and ``TypeError`` when ``metrics`` is not a
    mapping; nothing is returned then.
    """
    step = check_metric_step(step)
    if type(metrics) is not dict and not isinstance(metrics, Mapping):  # a plain dict skips the slower ABC check
        raise TypeError(f"metrics must be a dict of {{key: number}}, got {type(metrics).__name__}")
    points = []
    for key, value in metrics.items():
        if type(key) is not str or key not in _KEYS_SEEN:  # a str subclass is checked (and refused) every time
            _check_key(key)
        points.append((key, _as_float(key, value), step, now))
    return points


def _check_key(key) -> None:
    if type(key) is not str or not key or len(key) > METRIC_KEY_MAX or "\x00" in key:
        raise ValueError(
            f"metric key must be a non-empty str of at most {METRIC_KEY_MAX} characters without NUL, got {key!r}"
        )
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"metric key {key!r} is not valid Unicode text (a lone surrogate)") from None
    if len(_KEYS_SEEN) < _KEYS_SEEN_MAX:
        _KEYS_SEEN.add(key)


def _as_float(key: str, value) -> float:
    kind = type(value)
    if kind is float:
        return value
    if (kind is int or isinstance(value, numbers.Real)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"metric {key!r}: {value} does not fit a float") from None
    hint = "; pass a Python number such as tensor.item()" if hasattr(value, "item") else ""
    raise ValueError(
        f"metric {key!r}: value must be an int or float (NaN and ±inf allowed), got {type(value).__name__}{hint}"
    )


def wire_value(value: float) -> float | str:
    """``value`` as JSON carries it: finite floats as numbers, NaN and ±inf as ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"`` (docs/api.md)."""
    if math.isfinite(value):
        return value
    return _NON_FINITE_TEXT.get(value, "NaN")


def point_json(point: Point) -> str:
    """A point as the JSON object ``{"key", "value", "step", "timestamp"}``, ASCII (offline runs' lines)."""
    key, value, step, timestamp = point
    return json.dumps(
        {"key": key, "value": wire_value(value), "step": step, "timestamp": timestamp}, separators=(",", ":")
    )
