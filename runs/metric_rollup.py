"""Keeping ``MetricRollup`` current and reading charts from it: a key's extremes per fixed step bucket
(docs/design/resume.md#steps-continue; docs/design/interfaces.md#workspace).

A chart of a million-point key needs, per drawn step bucket, the points
holding its smallest and largest value. Computed from the points, that reads
every one of them on every view; here ``metrics_ingest`` folds each batch,
in the transaction that stores it, into one row per (run, key,
``step // ROLLUP_STEPS``) with that bucket's count, non-finite count and the
step, value and timestamp of its smallest and largest finite value. A chart
whose buckets are whole multiples of ``ROLLUP_STEPS`` steps then reads about
``points / ROLLUP_STEPS`` rows (3,907 for 1,000,000 points at consecutive
steps) and gets exactly what the points would give. A batch of 10,000
points adds one row per key and 256 steps it covers (40 rows for 10 keys
over 1,000 steps).

``rollup_add`` runs after ``summary_add``, whose upsert already holds each
(run, key) summary row's lock for the rest of the transaction, so two
writers of one key never interleave here (and take locks in the same order).
"""

import numpy as np
from django.db import connection

from mado.upsert import upsert
from runs.metric_batch import MetricColumns, SortedBatch, sort_by_key
from runs.models import MetricPoint, MetricRollup

ROLLUP_STEPS = 256  # changing it needs a migration that rebuilds every rollup
_TABLE = MetricRollup._meta.db_table
_FIELDS = (
    "run_id",
    "key",
    "bucket",
    "count",
    "non_finite",
    "min_step",
    "min_value",
    "min_timestamp",
    "max_step",
    "max_value",
    "max_timestamp",
)
_PG_TYPES = (
    "bigint",
    "varchar",
    "bigint",
    "bigint",
    "bigint",
    "bigint",
    "float8",
    "bigint",
    "bigint",
    "float8",
    "bigint",
)


def _on_conflict() -> str:
    t = _TABLE
    # The stored extreme wins a tie of value and step: it was stored first. A side with no finite value has NULLs,
    # and a comparison with NULL is never true.
    lower = (
        f"({t}.min_value IS NULL OR excluded.min_value < {t}.min_value OR "
        f"(excluded.min_value = {t}.min_value AND excluded.min_step < {t}.min_step))"
    )
    higher = (
        f"({t}.max_value IS NULL OR excluded.max_value > {t}.max_value OR "
        f"(excluded.max_value = {t}.max_value AND excluded.max_step < {t}.max_step))"
    )
    updates = [f"count = {t}.count + excluded.count", f"non_finite = {t}.non_finite + excluded.non_finite"]
    updates += [
        f"{side}_{part} = CASE WHEN {test} THEN excluded.{side}_{part} ELSE {t}.{side}_{part} END"
        for side, test in (("min", lower), ("max", higher))
        for part in ("step", "value", "timestamp")
    ]
    return f"ON CONFLICT (run_id, key, bucket) DO UPDATE SET {', '.join(updates)}"


def batch_rollups(run_id: int, batch: SortedBatch) -> list[tuple]:
    """One row of ``_FIELDS`` per distinct (key, step bucket) of ``batch``, sorted.

    The batch is sorted by (key, step), points of one step in the order they
    came, so among points tied on value and step the one earlier in the
    batch is the extreme.
    """
    size = len(batch.steps)
    steps, values, stamps = batch.steps, batch.values, batch.timestamps
    groups = np.repeat(np.arange(len(batch.keys)), batch.counts)
    buckets = steps // ROLLUP_STEPS
    starts = np.flatnonzero(np.r_[True, (groups[1:] != groups[:-1]) | (buckets[1:] != buckets[:-1])])
    counts = np.diff(np.r_[starts, size])
    member = np.repeat(np.arange(len(starts)), counts)  # the (key, bucket) group of each position
    finite = np.isfinite(values)
    non_finite = counts - np.add.reduceat(finite.astype(np.int64), starts)
    points = np.flatnonzero(finite)
    owners = member[points]
    lowest = _first_per_group(points, owners, steps, values[points])
    highest = _first_per_group(points, owners, steps, -values[points])

    def extreme(found: dict, group: int) -> tuple:
        index = found.get(group)
        if index is None:
            return None, None, None
        return int(steps[index]), float(values[index]), int(stamps[index])

    return [
        (
            run_id,
            batch.keys[groups[start]],
            int(buckets[start]),
            int(counts[group]),
            int(non_finite[group]),
            *extreme(lowest, group),
            *extreme(highest, group),
        )
        for group, start in enumerate(starts)
    ]


def _first_per_group(points, owners, steps, ranks) -> dict[int, int]:
    """``{group: index of its point with the lowest rank, then the lowest step, then the earliest}``."""
    ranked = np.lexsort((steps[points], ranks, owners))
    owners, points = owners[ranked], points[ranked]
    first = np.r_[True, owners[1:] != owners[:-1]] if len(owners) else np.zeros(0, dtype=bool)
    return dict(zip(owners[first].tolist(), points[first].tolist()))


def rollup_add(*, run_id: int, batch: SortedBatch) -> None:
    """Fold a batch about to be stored for Run ``run_id`` into its rollups; call inside the storing transaction,
    after ``summary_add``."""
    upsert(
        table=_TABLE, fields=_FIELDS, pg_types=_PG_TYPES, rows=batch_rollups(run_id, batch), on_conflict=_on_conflict()
    )


_ROWS = f"""
SELECT bucket, count, non_finite, min_step, min_value, min_timestamp, max_step, max_value, max_timestamp
FROM {_TABLE} WHERE run_id = %s AND key = %s AND bucket < %s ORDER BY bucket
"""
_NO_CUT = 2**63 - 1


def rollup_rows(*, run_id: int, key: str, before_step: int | None = None) -> list[tuple]:
    """The rollup rows of ``key`` in Run ``run_id`` by bucket, each ``(bucket, count, non_finite, min_step,
    min_value, min_timestamp, max_step, max_value, max_timestamp)``; with ``before_step``, of the points at
    steps below it only: the buckets wholly below it, then its own bucket's part folded from its points (at
    most ``ROLLUP_STEPS`` steps of them; an ancestor's curve up to where its child resumed,
    docs/design/resume.md#steps-continue)."""
    cut = _NO_CUT if before_step is None else before_step // ROLLUP_STEPS
    with connection.cursor() as cursor:
        cursor.execute(_ROWS, [run_id, key, cut])
        rows = cursor.fetchall()
    if before_step is not None and before_step % ROLLUP_STEPS:
        points = list(
            MetricPoint.objects.filter(run_id=run_id, key=key)
            .at_steps(cut * ROLLUP_STEPS, before_step - 1)
            .order_by("id")
            .values_list("step", "value", "timestamp")
        )
        if points:
            steps, values, stamps = (list(column) for column in zip(*points))
            batch = sort_by_key(MetricColumns([key] * len(steps), steps, values, stamps))
            rows += [row[2:] for row in batch_rollups(run_id, batch)]
    return rows


def rollup_extremes(rows: list[tuple], *, first_bucket: int, buckets_per_part: int) -> list[tuple[int, float, int]]:
    """``(step, value, timestamp_ms)`` of the points holding each part's smallest and largest finite value (one
    row when they are the same point), by step, from ``rollup_rows``; a part is ``buckets_per_part`` consecutive
    rollup buckets from ``first_bucket`` (the key's lowest), i.e. ``buckets_per_part * ROLLUP_STEPS`` steps.
    Ties: the lowest step.

    Two numpy sorts of some 4,000 rows for a million-point key cost less than SQL window functions over them.
    """
    rows = [row for row in rows if row[4] is not None]
    if not rows:
        return []
    columns = list(zip(*rows))
    parts = (np.array(columns[0], dtype=np.int64) - first_bucket) // buckets_per_part
    kept = set()
    for offset, sign in ((3, 1.0), (6, -1.0)):  # the min_* columns, then the max_* columns
        steps = np.array(columns[offset], dtype=np.int64)
        values = np.array(columns[offset + 1], dtype=np.float64)
        order = np.lexsort((steps, sign * values, parts))
        first = order[np.r_[True, parts[order][1:] != parts[order][:-1]]]
        kept.update(zip(steps[first].tolist(), values[first].tolist(), np.array(columns[offset + 2])[first].tolist()))
    return sorted(kept, key=lambda row: (row[0], row[1]))


# Arrays compare element by element: the smallest [value, step, …] is the lowest step holding the smallest value,
# the largest [value, -step, …] the lowest step holding the largest. Steps and millisecond timestamps are below
# 2**53, exact as float8. One hash aggregate, no sort: a tenth of the time of DISTINCT ON over the same rows.
_PARTS = f"""
SELECT SUM(count), SUM(non_finite),
       MIN(ARRAY[min_value, min_step, min_timestamp]) FILTER (WHERE min_value IS NOT NULL),
       MAX(ARRAY[max_value, -max_step, max_timestamp]) FILTER (WHERE max_value IS NOT NULL)
FROM {_TABLE} WHERE run_id = %s AND key = %s AND bucket < %s GROUP BY (bucket - %s) / %s
"""


def rollup_part_extremes(
    *, run_id: int, key: str, first_bucket: int, buckets_per_part: int, before_bucket: int | None = None
) -> tuple[list[tuple[int, float, int]], int, int]:
    """``rollup_extremes`` of the key's rollup rows below bucket ``before_bucket`` (None: all), computed by the
    database: ``(points, total, non_finite)``, ``points`` the ``(step, value, timestamp_ms)`` rows by step,
    ``total`` / ``non_finite`` the points counted. A 10,000,000-point key has 39,063 rollup rows: read into
    Python they cost more than the chart's whole budget, grouped in SQL a chart of 2,000 points comes back.
    """
    cut = _NO_CUT if before_bucket is None else before_bucket
    with connection.cursor() as cursor:
        cursor.execute(_PARTS, [run_id, key, cut, first_bucket, buckets_per_part])
        parts = cursor.fetchall()
    kept = set()
    for _count, _bad, low, high in parts:
        if low is not None:
            kept.add((int(low[1]), low[0], int(low[2])))
            kept.add((int(-high[1]), high[0], int(high[2])))
    total, non_finite = sum(part[0] for part in parts), sum(part[1] for part in parts)
    return sorted(kept, key=lambda row: (row[0], row[1])), int(total), int(non_finite)
