"""The per-run, per-key metric summary that keeps "last step", "keys" and "count" O(1) in a run's size (SPEC F2, F24)."""

from django.db import models

from runs.models.core import Run, VisibleQuerySet


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
        indexes = [models.Index(fields=["key", "run"], include=["last_value", "min_value", "max_value"],
                                name="metricsummary_key_run_idx")]

    def __str__(self):
        return f"{self.run_id}:{self.key}"


class MetricRollup(models.Model):
    """A run's points of one ``key`` at steps ``bucket * ROLLUP_STEPS`` to ``(bucket + 1) * ROLLUP_STEPS - 1``, folded
    by ``metrics_ingest`` in the writing transaction (``runs.metric_rollup``; SPEC F2, F34).

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
        constraints = [models.UniqueConstraint(fields=["run", "key", "bucket"], name="metricrollup_unique_run_key_bucket")]

    def __str__(self):
        return f"{self.run_id}:{self.key}:{self.bucket}"
