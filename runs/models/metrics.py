"""Metric points: stored in chunks, read through a view, summed up per key and per step bucket
(docs/design/resume.md#steps-continue; docs/design/runs.md#resume-modes; docs/design/interfaces.md#workspace)."""

import math

from django.db import models
from django.db.models import F, OuterRef, Q, Subquery

from runs.models.arrays import NumberArrayField
from runs.models.core import Run, VisibleQuerySet

# A point's id in the view is its chunk's id * CHUNK_ID_STRIDE + its place in the chunk (from 0): ids grow in the order
# points were stored, and a chunk holds fewer points than the stride (``metrics_ingest`` cuts batches to fit).
CHUNK_ID_STRIDE = 2**20


class MetricChunk(models.Model):
    """Up to a batch's points of one ``key`` of a Run, as three arrays of one length: how points are stored
    (docs/design/resume.md#steps-continue).

    ``metrics_ingest`` writes one chunk per key of a batch (on SQLite, per
    ``SQLITE_CHUNK_POINTS`` points of it), its arrays sent as binary
    parameters on PostgreSQL: one row and one index entry per chunk instead
    of per point, which took most of the database's CPU per batch
    (docs/deploy.md, "Measured"). ``steps[i]``,
    ``values[i]`` (NaN as NaN) and ``timestamps[i]`` (Unix milliseconds) are
    point ``i``; the points are sorted by step, ties in the order they were
    sent. ``first_step`` / ``last_step`` are the lowest and highest step and
    ``count`` the length. Chunks are never changed: a Run's points only grow,
    and deleting the Run deletes its chunks. Read points through
    ``MetricPoint``, the view that unnests them.
    """

    # No database foreign key: PostgreSQL checks one with a trigger per row. Deleting a Run through the ORM still
    # deletes its chunks (one ``DELETE … WHERE run_id IN``, as long as no delete signal receiver watches this model).
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="metric_chunks", db_index=False, db_constraint=False
    )
    key = models.CharField(max_length=250)
    first_step = models.BigIntegerField()
    last_step = models.BigIntegerField()
    count = models.IntegerField()
    steps = NumberArrayField(kind="int8")
    values = NumberArrayField(kind="float8")
    timestamps = NumberArrayField(kind="int8")

    class Meta:
        # (last_step, id) orders a key's chunks as their points when no two overlap (``runs.history``); it also finds
        # the chunks reaching a step (``MetricPointQuerySet.at_steps``) and those holding a key's last step.
        indexes = [
            models.Index(
                fields=["run", "key", "last_step", "id"],
                include=["first_step", "count"],
                name="metricchunk_run_key_last_idx",
            )
        ]
        constraints = [
            models.CheckConstraint(condition=Q(first_step__gte=0), name="metricchunk_step_non_negative"),
            models.CheckConstraint(condition=Q(last_step__gte=F("first_step")), name="metricchunk_steps_ordered"),
            models.CheckConstraint(condition=Q(count__gt=0, count__lt=CHUNK_ID_STRIDE), name="metricchunk_count_range"),
        ]

    def __str__(self):
        return f"{self.run_id}:{self.key}:{self.first_step}-{self.last_step}"


class MetricPointQuerySet(VisibleQuerySet):
    project_path = "run__project"

    def at_steps(self, low: int | None = None, high: int | None = None) -> "MetricPointQuerySet":
        """The points at steps ``low`` to ``high`` (both included; None: unbounded), reading only the chunks that
        reach into that range (a step filter alone would unnest every chunk of the key first)."""
        points = self
        if low is not None:
            points = points.filter(step__gte=low, chunk_last_step__gte=low)
        if high is not None:
            points = points.filter(step__lte=high, chunk_first_step__lte=high)
        return points

    def at_last_step(self) -> "MetricPointQuerySet":
        """The points at their key's highest step (its ``MetricSummary.last_step``): all lie in the chunks ending
        there, so only those are unnested (MLflow's latest metrics)."""
        last = Subquery(
            MetricSummary.objects.filter(run_id=OuterRef("run_id"), key=OuterRef("key")).values("last_step")[:1]
        )
        return self.filter(step=last, chunk_last_step=last)


class MetricPoint(models.Model):
    """One logged value, read-only: a row of the ``runs_metricpoint`` view over ``MetricChunk``
    (docs/design/resume.md#steps-continue).

    ``value`` NULL is NaN; ±Infinity is stored as is. ``timestamp`` is
    wall-clock milliseconds since the epoch (MLflow's unit). ``id`` orders
    points as they were stored (``CHUNK_ID_STRIDE``); ``chunk_first_step`` /
    ``chunk_last_step`` are the step range of the point's chunk: filter on
    them (``at_steps``) so the database unnests only the chunks that matter.
    Points are written only by ``metrics_ingest``, as chunks.
    """

    id = models.BigIntegerField(primary_key=True)
    run = models.ForeignKey(
        Run, on_delete=models.DO_NOTHING, related_name="metric_points", db_index=False, db_constraint=False
    )
    key = models.CharField(max_length=250)
    step = models.BigIntegerField()
    value = models.FloatField(null=True)
    timestamp = models.BigIntegerField()
    chunk = models.ForeignKey(
        MetricChunk, on_delete=models.DO_NOTHING, related_name="points", db_index=False, db_constraint=False
    )
    chunk_first_step = models.BigIntegerField()
    chunk_last_step = models.BigIntegerField()

    objects = MetricPointQuerySet.as_manager()

    class Meta:
        managed = False
        db_table = "runs_metricpoint"

    def __str__(self):
        return f"{self.run_id}:{self.key}@{self.step}"

    @staticmethod
    def to_db_value(value: float) -> float | None:
        return None if math.isnan(value) else value

    @staticmethod
    def from_db_value(value: float | None) -> float:
        return math.nan if value is None else value


class MetricSummaryQuerySet(VisibleQuerySet):
    project_path = "run__project"


class MetricSummary(models.Model):
    """What a run's points of one ``key`` add up to, kept current by ``metrics_ingest`` in the writing transaction.

    It always equals a recomputation over the stored points (``MetricPoint``):
    ``count`` points, steps ``first_step``..``last_step``, ``last_value`` the
    value at the highest step (the last stored on a tie; NULL is NaN),
    ``min_value`` / ``max_value`` over the values that are not NaN (±Infinity
    included; NULL when every value is NaN), timestamps in Unix milliseconds.
    Deleting the Run deletes it with the points.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_summaries")
    key = models.CharField(max_length=250)
    count = models.BigIntegerField()
    first_step = models.BigIntegerField()
    last_step = models.BigIntegerField()
    last_value = models.FloatField(null=True)
    min_value = models.FloatField(null=True)
    max_value = models.FloatField(null=True)
    first_timestamp = models.BigIntegerField()
    last_timestamp = models.BigIntegerField()

    objects = MetricSummaryQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="metricsummary_unique_run_key")]
        # The runs table sorted by a metric reads one key's summaries of every Run (an index-only scan on
        # PostgreSQL, which alone honours ``include``).
        indexes = [
            models.Index(
                fields=["key", "run"],
                include=["last_value", "min_value", "max_value"],
                name="metricsummary_key_run_idx",
            )
        ]

    def __str__(self):
        return f"{self.run_id}:{self.key}"


class MetricRollup(models.Model):
    """A run's points of one ``key`` at steps ``bucket * ROLLUP_STEPS`` to ``(bucket + 1) * ROLLUP_STEPS - 1``, folded
    by ``metrics_ingest`` in the writing transaction (``runs.metric_rollup``; docs/design/resume.md#steps-continue;
    docs/design/interfaces.md#workspace).

    It always equals a recomputation over those points: ``count`` of them,
    ``non_finite`` of which are NaN or ±Infinity; ``min_*`` / ``max_*`` the
    step, value and Unix-millisecond timestamp of the point holding the
    smallest / largest finite value (the lowest step on a tie, then the one
    stored first); all six NULL when no value of the bucket is finite. A
    chart of a million-point key reads these rows, not the points.
    """

    # No database foreign key (as for the points it folds): one more trigger per upserted row on the write path;
    # deleting the Run through the ORM still deletes these rows.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="metric_rollups", db_index=False, db_constraint=False
    )
    key = models.CharField(max_length=250)
    bucket = models.BigIntegerField()
    count = models.BigIntegerField()
    non_finite = models.BigIntegerField()
    min_step = models.BigIntegerField(null=True)
    min_value = models.FloatField(null=True)
    min_timestamp = models.BigIntegerField(null=True)
    max_step = models.BigIntegerField(null=True)
    max_value = models.FloatField(null=True)
    max_timestamp = models.BigIntegerField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "key", "bucket"], name="metricrollup_unique_run_key_bucket")
        ]
        indexes = [
            # A key's rows are written batch by batch among every other Run's, so they lie scattered over the
            # table: a chart of a 10,000,000-point key read its 39,063 rows from as many heap pages. Read from this
            # index alone (PostgreSQL; SQLite ignores the included columns).
            models.Index(
                fields=["run", "key", "bucket"],
                include=[
                    "count",
                    "non_finite",
                    "min_step",
                    "min_value",
                    "min_timestamp",
                    "max_step",
                    "max_value",
                    "max_timestamp",
                ],
                name="metricrollup_covering_idx",
            )
        ]

    def __str__(self):
        return f"{self.run_id}:{self.key}:{self.bucket}"
