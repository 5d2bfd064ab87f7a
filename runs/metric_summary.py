"""Keeping ``MetricSummary`` current: a batch's per-key figures folded in by one upsert
(docs/design/resume.md#steps-continue; docs/design/runs.md#resume-modes).

``metrics_ingest`` calls ``summary_add`` in the transaction that stores the
points, before it inserts them: the upsert locks each (run, key) summary row
in key order, so two writers of one run's key queue there (no deadlock: the
same order for all) and the later one's chunks get the higher ids, which
keeps "the last value is the one stored last at the highest step" true.
"""

import numpy as np
from django.db import connection

from mado.upsert import upsert
from runs.metric_batch import SortedBatch
from runs.models import MetricSummary

_TABLE = MetricSummary._meta.db_table
_FIELDS = (
    "run_id",
    "key",
    "count",
    "first_step",
    "last_step",
    "last_value",
    "min_value",
    "max_value",
    "first_timestamp",
    "last_timestamp",
)
_PG_TYPES = ("bigint", "varchar", "bigint", "bigint", "bigint", "float8", "float8", "float8", "bigint", "bigint")


def _on_conflict() -> str:
    least, greatest = ("LEAST", "GREATEST") if connection.vendor == "postgresql" else ("min", "max")
    t = _TABLE
    # SQLite's two-argument min/max is NULL when either side is; PostgreSQL's LEAST/GREATEST skip NULLs.
    return f"""
        ON CONFLICT (run_id, key) DO UPDATE SET
            count = {t}.count + excluded.count,
            first_step = {least}({t}.first_step, excluded.first_step),
            last_step = {greatest}({t}.last_step, excluded.last_step),
            last_value = CASE WHEN excluded.last_step >= {t}.last_step THEN excluded.last_value ELSE {t}.last_value END,
            min_value = COALESCE({least}({t}.min_value, excluded.min_value), {t}.min_value, excluded.min_value),
            max_value = COALESCE({greatest}({t}.max_value, excluded.max_value), {t}.max_value, excluded.max_value),
            first_timestamp = {least}({t}.first_timestamp, excluded.first_timestamp),
            last_timestamp = {greatest}({t}.last_timestamp, excluded.last_timestamp)
    """


def batch_summaries(run_id: int, batch: SortedBatch) -> list[tuple]:
    """One row of ``_FIELDS`` per distinct key of ``batch``, sorted by key.

    The batch is sorted by (key, step), stable, so the last row of a group
    is the point stored last at the key's highest step.
    """
    starts, counts, steps, values, stamps = batch.starts, batch.counts, batch.steps, batch.values, batch.timestamps
    ends = starts + counts - 1
    lows, highs = np.fmin.reduceat(values, starts), np.fmax.reduceat(values, starts)  # fmin/fmax skip nan
    first_ts, last_ts = np.minimum.reduceat(stamps, starts), np.maximum.reduceat(stamps, starts)
    return [
        (
            run_id,
            key,
            int(counts[g]),
            int(steps[starts[g]]),
            int(steps[ends[g]]),
            _or_none(values[ends[g]]),
            _or_none(lows[g]),
            _or_none(highs[g]),
            int(first_ts[g]),
            int(last_ts[g]),
        )
        for g, key in enumerate(batch.keys)
    ]


def _or_none(value) -> float | None:
    return None if value != value else float(value)


def summary_add(*, run_id: int, batch: SortedBatch) -> None:
    """Fold a batch about to be stored for Run ``run_id`` into its summaries; call inside the storing transaction."""
    upsert(
        table=_TABLE,
        fields=_FIELDS,
        pg_types=_PG_TYPES,
        rows=batch_summaries(run_id, batch),
        on_conflict=_on_conflict(),
    )
