"""A metrics batch read into columns and validated column by column (docs/design/resume.md#steps-continue).

Two wire formats carry the same points:

- rows: ``{"points": [{"key", "value", "step", "timestamp"?}, …]}`` (field
  names in errors: ``points[3].value``);
- columns: ``{"keys": [...], "steps": [...], "values": [...], "timestamps": [...]?}``,
  four lists of one length, point ``i`` being the ``i``-th item of each
  (errors: ``values[3]``). The SDK sends this one: no key names repeated per
  point, and the server checks each column with a few C-level passes
  (``set(map(type, column))``, ``min``, ``max``) instead of a Python loop per
  point. Only a column that fails is walked point by point, to name the first
  bad one.
"""

import math
from typing import NamedTuple

import numpy as np
from django.conf import settings

from mado.errors import ValidationFailed
from runs.models import MetricChunk

_NON_FINITE = {
    "NaN": None,
    "nan": None,
    "Infinity": math.inf,
    "inf": math.inf,
    "-Infinity": -math.inf,
    "-inf": -math.inf,
}
STEP_MAX = _INT64_MAX = 2**63 - 1  # steps and millisecond timestamps are BIGINT columns
_TS_MAX = 9.2e15  # Unix seconds whose milliseconds still fit a BIGINT
_KEY_MAX = MetricChunk._meta.get_field("key").max_length
_MISSING = object()
_COLUMNS = ("keys", "steps", "values", "timestamps")


class MetricColumns(NamedTuple):
    """A validated batch: ``keys`` (a list of str) and numpy columns of one length, ``steps`` (int64),
    ``values`` (float64, NaN for NaN) and ``timestamps`` (int64 Unix ms)."""

    keys: list
    steps: np.ndarray
    values: np.ndarray
    timestamps: np.ndarray


class SortedBatch(NamedTuple):
    """A validated batch sorted by (key, step), points of one key and step in the order they came
    (docs/design/resume.md#steps-continue).

    Key ``keys[g]`` (distinct, sorted) holds sorted positions ``starts[g]``
    to ``starts[g] + counts[g] - 1``; ``steps`` (int64), ``values``
    (float64, NaN for NaN) and ``timestamps`` (int64 Unix ms) are numpy
    columns in that order. The summaries and the chunks are both cut from it.
    """

    keys: list
    starts: np.ndarray
    counts: np.ndarray
    steps: np.ndarray
    values: np.ndarray
    timestamps: np.ndarray


def sort_by_key(columns: MetricColumns) -> SortedBatch:
    """``columns`` (a non-empty, validated batch; lists are taken too, None as NaN) as a ``SortedBatch``: one
    stable numpy sort by (key, step)."""
    keys = sorted(set(columns.keys))
    code = {key: index for index, key in enumerate(keys)}
    size = len(columns.keys)
    groups = np.fromiter(map(code.__getitem__, columns.keys), dtype=np.int64, count=size)
    steps = np.asarray(columns.steps, dtype=np.int64)
    order = np.lexsort((steps, groups))
    groups = groups[order]
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    return SortedBatch(
        keys,
        starts,
        np.diff(np.r_[starts, size]),
        steps[order],
        np.asarray(columns.values, dtype=np.float64)[order],  # None (NaN) becomes nan
        np.asarray(columns.timestamps, dtype=np.int64)[order],
    )


def parse_value(raw, field: str) -> float:
    """A metric value: a JSON number or one of ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.

    Raises ``ValidationFailed`` naming ``field`` for anything else (booleans included).
    """
    value = _value_or_error(raw)
    if isinstance(value, str):
        raise ValidationFailed(value, field=field)
    return math.nan if value is None else value


def columns_from_rows(points, *, now_ms: int, timestamps_ms: bool = False) -> MetricColumns:
    """Validate the row format (a list of point objects); ``ValidationFailed`` names ``points[i].<field>``."""
    _check_length(points, "points", "points must be a list of {key, value, step, timestamp}")
    for index, point in enumerate(points):
        if type(point) is not dict:
            raise ValidationFailed("each point must be an object", field=f"points[{index}]")
    return _validated(
        [p.get("key") for p in points],
        [p.get("step") for p in points],
        [p.get("value", _MISSING) for p in points],
        [p.get("timestamp") for p in points],
        lambda column, i: f"points[{i}].{column}",
        now_ms,
        timestamps_ms,
    )


def columns_from_columnar(body: dict, *, now_ms: int) -> MetricColumns:
    """Validate the columnar format ``{"keys", "steps", "values", "timestamps"?}``; errors name ``values[i]`` etc."""
    unknown = sorted(set(body) - set(_COLUMNS))
    if unknown:
        raise ValidationFailed(
            f"unknown field {unknown[0]!r}; a columnar batch has {', '.join(_COLUMNS)}", field=unknown[0]
        )
    keys = body.get("keys")
    _check_length(keys, "keys", "keys must be a list of metric names, one per point")
    for column in ("steps", "values", "timestamps"):
        items = body.get(column)
        if column == "timestamps" and items is None:
            continue
        if not isinstance(items, list) or len(items) != len(keys):
            raise ValidationFailed(f"{column} must be a list as long as keys ({len(keys)})", field=column)
    timestamps = body.get("timestamps") or [None] * len(keys)
    return _validated(
        keys, body["steps"], body["values"], timestamps, lambda column, i: f"{column}s[{i}]", now_ms, False
    )


def _check_length(items, field: str, shape: str) -> None:
    limit = settings.MADO_METRIC_BATCH_MAX
    if not isinstance(items, list):
        raise ValidationFailed(shape, field=field)
    if not items:
        raise ValidationFailed(f"{field} must not be empty", field=field)
    if len(items) > limit:
        raise ValidationFailed(f"a batch holds at most {limit} points, got {len(items)}", field=field)


def _validated(keys, steps, values, timestamps, name, now_ms: int, timestamps_ms: bool) -> MetricColumns:
    return MetricColumns(
        _keys(keys, name),
        _steps(steps, name),
        _values(values, name),
        _timestamps(timestamps, name, now_ms, timestamps_ms),
    )


def _first_bad(items, is_bad) -> int:
    return next(i for i, item in enumerate(items) if is_bad(item))


def _bad_key(key) -> bool:
    return type(key) is not str or not key or len(key) > _KEY_MAX or "\x00" in key


def _keys(keys: list, name) -> list:
    if set(map(type, keys)) == {str} and not any(map(_bad_key, set(keys))):
        return keys
    raise ValidationFailed(
        f"key must be a non-empty string of at most {_KEY_MAX} characters without NUL",
        field=name("key", _first_bad(keys, _bad_key)),
    )


def _bad_step(step) -> bool:
    return type(step) is not int or not 0 <= step <= _INT64_MAX


def _steps(steps: list, name) -> np.ndarray:
    if set(map(type, steps)) == {int}:
        try:
            column = np.array(steps, dtype=np.int64)
        except OverflowError:  # beyond 2**63 - 1
            column = None
        if column is not None and column.min() >= 0:
            return column
    raise ValidationFailed(
        "step must be an integer from 0 to 2**63 - 1", field=name("step", _first_bad(steps, _bad_step))
    )


def _value_or_error(raw):
    """``raw`` as a float (None for NaN), or the error text (a ``str``) when it is not a metric value."""
    kind = type(raw)
    if kind is float:
        return None if raw != raw else raw
    if kind is int:
        try:
            return float(raw)
        except OverflowError:  # a JSON integer beyond the float range
            return "value is too large for a 64-bit float"
    if kind is str and raw in _NON_FINITE:
        return _NON_FINITE[raw]
    if raw is _MISSING:
        return "value is required"
    if kind is bool:
        return "value must be a number, not a boolean"
    return f"value must be a number or NaN/Infinity/-Infinity, got {raw!r}"


def _values(values: list, name) -> np.ndarray:
    if set(map(type, values)) == {float}:  # the common case: plain floats (NaN stays NaN)
        return np.array(values, dtype=np.float64)
    converted = list(map(_value_or_error, values))
    for index, value in enumerate(converted):
        if type(value) is str:
            raise ValidationFailed(value, field=name("value", index))
    return np.array(converted, dtype=np.float64)  # None (NaN) becomes nan


def _bad_ms(t) -> bool:
    return t is not None and (type(t) is not int or not 0 <= t <= _INT64_MAX)


def _bad_seconds(t) -> bool:
    return t is not None and (type(t) not in (int, float) or not 0 <= t < _TS_MAX)  # NaN fails both comparisons


def _timestamps(timestamps: list, name, now_ms: int, in_ms: bool) -> np.ndarray:
    """Unix milliseconds: from integer milliseconds (``in_ms``, the MLflow API) or seconds; None means ``now_ms``."""
    kinds = set(map(type, timestamps))
    if kinds == {type(None)}:
        return np.full(len(timestamps), now_ms, dtype=np.int64)
    if kinds == {float} and not in_ms:  # what the SDK sends
        seconds = np.array(timestamps, dtype=np.float64)
        if seconds.min() >= 0 and seconds.max() < _TS_MAX:  # NaN fails both comparisons
            # numpy's float64 product and truncation are int(t * 1000)'s.
            return (seconds * 1000).astype(np.int64)
    present = [t for t in timestamps if t is not None]
    if in_ms:
        if kinds <= {int, type(None)} and min(present) >= 0 and max(present) <= _INT64_MAX:
            return np.array([now_ms if t is None else t for t in timestamps], dtype=np.int64)
        unit, is_bad = "integer milliseconds", _bad_ms
    else:
        if (
            kinds <= {int, float, type(None)}
            and min(present) >= 0
            and max(present) < _TS_MAX
            and all(t == t for t in present)
        ):
            return np.array([now_ms if t is None else int(t * 1000) for t in timestamps], dtype=np.int64)
        unit, is_bad = "seconds (a number >= 0)", _bad_seconds
    raise ValidationFailed(
        f"timestamp must be Unix time in {unit}", field=name("timestamp", _first_bad(timestamps, is_bad))
    )
