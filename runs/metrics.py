"""Metric ingestion: validate a batch by column, fold it into the summaries, insert it in one statement
(docs/design/resume.md#steps-continue).

A batch holds up to 10,000 points and one writer must sustain 150,000
points/s on PostgreSQL, so nothing here loops over points in Python except
building the rows handed to the driver: validation works on whole columns
(``runs.metric_batch``), the batch is sorted by (key, step) once in numpy
(``sort_by_key``) for the per-key summary (``runs.metric_summary``) and the
chunks, and the chunks go in as one row per key of the batch, not per point,
their arrays encoded from numpy as binary parameters on PostgreSQL
(``runs.models.arrays.pg_array``) or JSON text on SQLite.

On PostgreSQL the whole write is one round trip and the commit
(``mado.db.pipelined``): the Run's row (lease and crashed checks), the
batch's claim, the summaries, the rollups and the chunks are sent together,
and the answers are judged after. A refused or replayed batch rolls back what
was sent with it. Each round trip is two wake-ups of a web thread and of a
database backend: under load, that wait for a CPU, not the work, is most of a
POST's time (docs/design/resume.md#steps-continue).
"""

import time
from collections.abc import Callable
from functools import partial
from itertools import compress
from typing import NamedTuple

import psycopg
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from mado import policy
from mado.db import pipelined
from mado.errors import ValidationFailed
from runs import hooks
from runs.liveness import run_touch, write_guard
from runs.metric_batch import MetricColumns, SortedBatch, columns_from_columnar, columns_from_rows, sort_by_key
from runs.metric_rollup import rollup_add
from runs.metric_summary import summary_add
from runs.models import CHUNK_ID_STRIDE, MetricBatch, MetricChunk, Run
from runs.models.arrays import json_numbers, pg_array, register_pg_arrays
from runs.segments import segment_points_add

_TABLE = MetricChunk._meta.db_table
_BATCHES = MetricBatch._meta.db_table
_INSERT = (
    f'INSERT INTO {_TABLE} (run_id, key, first_step, last_step, count, steps, "values", timestamps) '
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)
SQLITE_CHUNK_POINTS = 500  # the SQLite view's json_extract walks a chunk's array from its start: cost ~ size squared


class MetricsIngested(NamedTuple):
    """What ``metrics_ingest`` did with a batch: points ``stored`` in the series, ``dropped`` below the step floor
    and their keys, ``compared``: points below the floor kept as the resumed segment's own record."""

    stored: int
    dropped: int
    dropped_keys: list[str]
    replayed: bool
    compared: int = 0


def _columns_where(columns: MetricColumns, mask) -> MetricColumns:
    return MetricColumns(
        list(compress(columns.keys, mask.tolist())), columns.steps[mask], columns.values[mask], columns.timestamps[mask]
    )


def _split_at_floor(columns: MetricColumns, floor: int) -> tuple[MetricColumns, MetricColumns | None]:
    """``columns`` at a step from ``floor`` on, and those below it (None when there are none)."""
    if not floor or columns.steps.min() >= floor:
        return columns, None
    keep = columns.steps >= floor
    return _columns_where(columns, keep), _columns_where(columns, ~keep)


def metrics_ingest(
    *,
    actor,
    run: Run,
    points: list[dict] | None = None,
    columns: dict | None = None,
    idempotency_key: str | None = None,
    timestamps_ms: bool = False,
    fencing_token: int | None = None,
) -> MetricsIngested:
    """Store a batch of metric points for ``run`` and update its summaries; all or nothing
    (docs/design/resume.md#steps-continue; docs/design/runs.md#resume-modes, #one-writer-process).

    The batch is ``points`` (rows) or ``columns`` (columnar), one of the two:

    - ``points``: a list of at most ``MADO_METRIC_BATCH_MAX`` (10,000)
      objects ``{"key": str, "value": number | "NaN" | "Infinity" |
      "-Infinity", "step": int >= 0, "timestamp": Unix seconds (optional,
      default now)}``. With ``timestamps_ms`` (the MLflow API)
      ``timestamp`` is integer Unix milliseconds, stored exactly.
    - ``columns``: ``{"keys": [str], "steps": [int], "values": [...],
      "timestamps": [Unix seconds] (optional)}``, lists of one length.

    NaN and ±Infinity are valid values and are stored (a diverged loss is
    information). ``idempotency_key`` (≤ 200 characters, from the
    ``Idempotency-Key`` header) makes a repeated batch a no-op (``replayed``,
    nothing stored or counted): an SDK retry after a lost answer, or ``mado
    sync`` run twice, never duplicates a point. Points at a step below
    ``run.step_floor`` (a resumed Run's last step + 1) never enter the Run's
    series: they are kept as the points of the Run's latest resume segment
    and counted in ``compared`` (docs/design/resume.md#same-run-parity;
    ``runs.hooks.segment_points_stored`` after the commit), or, for a Run
    resumed before segments were kept, dropped, added to
    ``Run.dropped_points`` and reported in ``dropped`` / ``dropped_keys``
    (sorted, distinct). ``fencing_token`` (the ``Mado-Fencing-Token``
    header; None: not fenced) is checked in the writing transaction. The
    Run's ``MetricSummary`` and ``MetricRollup`` rows change in the same transaction as its points.

    Raises ``Forbidden`` unless the actor may write to the Run (``policy.why_cannot_write_run``,
    docs/design/runs.md#write-rule), ``ValidationFailed`` naming the first bad field (``points[3].value`` or
    ``values[3]``), ``LeaseLost`` for a stale ``fencing_token``, ``RunEnded`` (409 ``run_ended``) when the Run was ended
    ``crashed`` (docs/design/runs.md#liveness); nothing of a refused batch is stored. Once the batch commits,
    ``runs.hooks.metrics_stored`` tells the higher apps (each key's first and last step, the sorted batch).
    """
    policy.require_run_writer(actor, run)
    now_ms = int(time.time() * 1000)
    if columns is not None:
        batch = columns_from_columnar(columns, now_ms=now_ms)
    else:
        batch = columns_from_rows(points, now_ms=now_ms, timestamps_ms=timestamps_ms)
    if idempotency_key is not None and not 0 < len(idempotency_key) <= 200:
        raise ValidationFailed("Idempotency-Key must be 1 to 200 characters", field="Idempotency-Key")
    # A matching token proves no resume happened since this writer started, so run.step_floor is current.
    batch, below = _split_at_floor(batch, run.step_floor)
    dropped, dropped_keys, segment_id = 0, [], None
    with transaction.atomic():
        with pipelined():
            refuse_if_stale_or_crashed = write_guard(run_id=run.pk, fencing_token=fencing_token)
            claimed = _claim_batch(run.pk, idempotency_key, len(batch.keys)) if idempotency_key is not None else None
            if batch.keys:
                by_key = sort_by_key(batch)
                summary_add(run_id=run.pk, batch=by_key)
                rollup_add(run_id=run.pk, batch=by_key)
                _insert(run.pk, by_key)
        refuse_if_stale_or_crashed()
        if claimed is not None and not claimed():
            transaction.set_rollback(True)  # a replay: what was sent with the claim is undone
            return MetricsIngested(0, 0, [], replayed=True)
        if below is not None:  # docs/design/resume.md#same-run-parity
            added = segment_points_add(run_id=run.pk, below=below)
            if added is None:  # resumed before segments were kept: dropped, as then
                dropped, dropped_keys = len(below.keys), sorted(set(below.keys))
            else:
                segment_id = added.segment_id
                transaction.on_commit(
                    partial(hooks.segment_points_stored.send, sender=None, run=run, **added._asdict()), robust=True
                )
        if dropped:
            Run.objects.filter(pk=run.pk).update(dropped_points=F("dropped_points") + dropped)
        if run.heartbeat_at is None:  # a Run that beats is judged by its heartbeats: no UPDATE per batch
            run_touch(run_id=run.pk)
        if batch.keys:
            firsts, lasts = by_key.steps[by_key.starts], by_key.steps[by_key.starts + by_key.counts - 1]
            steps = dict(zip(by_key.keys, zip(firsts.tolist(), lasts.tolist())))
            transaction.on_commit(
                partial(hooks.metrics_stored.send, sender=None, run=run, steps=steps, batch=by_key), robust=True
            )
    compared = 0 if below is None or segment_id is None else len(below.keys)
    return MetricsIngested(len(batch.keys), dropped, dropped_keys, replayed=False, compared=compared)


def _claim_batch(run_id: int, key: str, points: int) -> Callable[[], bool]:
    """Send the record of batch ``key`` of Run ``run_id``; return a function that says whether it was recorded
    (False: it was already, a replay). Call that after the pipeline.

    ``ON CONFLICT DO NOTHING`` rather than a savepoint around an INSERT that
    may fail: two fewer round trips per batch. A concurrent copy of the same
    batch waits for this transaction and then inserts nothing.
    """
    cursor = connection.cursor()
    cursor.execute(
        f"INSERT INTO {_BATCHES} (run_id, key, points, created_at) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (run_id, key) DO NOTHING",
        [run_id, key, points, connection.ops.adapt_datetimefield_value(timezone.now())],
    )

    def claimed() -> bool:
        with cursor:
            return cursor.rowcount == 1

    return claimed


def _chunks(batch: SortedBatch, size: int):
    """``(key, start, stop)`` of each chunk: a key's sorted positions cut into runs of at most ``size`` points."""
    for key, first, count in zip(batch.keys, batch.starts.tolist(), batch.counts.tolist()):
        for start in range(first, first + count, size):
            yield key, start, min(start + size, first + count)


def _insert(run_id: int, batch: SortedBatch) -> None:
    """Store ``batch`` as ``MetricChunk`` rows: one per key (cut below ``CHUNK_ID_STRIDE`` points; on SQLite,
    ``SQLITE_CHUNK_POINTS``), ids in key order."""
    steps, values, stamps = batch.steps, batch.values, batch.timestamps
    if connection.vendor == "postgresql":
        # A server-side binding cursor: the arrays travel as binary parameters, not as text in the statement.
        with psycopg.Cursor(connection.connection) as cursor:
            register_pg_arrays(cursor)
            cursor.executemany(
                _INSERT,
                [
                    (
                        run_id,
                        key,
                        int(steps[start]),
                        int(steps[stop - 1]),
                        stop - start,
                        pg_array("int8", steps[start:stop]),
                        pg_array("float8", values[start:stop]),
                        pg_array("int8", stamps[start:stop]),
                    )
                    for key, start, stop in _chunks(batch, CHUNK_ID_STRIDE - 1)
                ],
            )
        return
    with connection.cursor() as cursor:
        cursor.executemany(
            _INSERT,
            [
                (
                    run_id,
                    key,
                    int(steps[start]),
                    int(steps[stop - 1]),
                    stop - start,
                    json_numbers(steps[start:stop].tolist()),
                    json_numbers(values[start:stop].tolist()),
                    json_numbers(stamps[start:stop].tolist()),
                )
                for key, start, stop in _chunks(batch, SQLITE_CHUNK_POINTS)
            ],
        )
