"""The per-run, per-key, per-256-step-bucket metric rollup, filled from the points already stored (charts,
docs/design/interfaces.md#workspace)."""

import math

import django.db.models.deletion
from django.db import migrations, models

ROLLUP_STEPS = 256  # runs.metric_rollup.ROLLUP_STEPS when this migration was written


def backfill_rollups(apps, schema_editor):
    """One rollup row per (run, key, bucket) that has points: the figures ``metrics_ingest`` keeps current."""
    points = apps.get_model("runs", "MetricPoint")._meta.db_table
    rollups = apps.get_model("runs", "MetricRollup")._meta.db_table
    finite = "value IS NOT NULL AND value <> %s AND value <> %s"
    ranked = f"""
        SELECT run_id, key, step / {ROLLUP_STEPS} AS bucket, step, value, timestamp,
               ROW_NUMBER() OVER (PARTITION BY run_id, key, step / {ROLLUP_STEPS} ORDER BY value {{}}, step, id) AS n
        FROM {points} WHERE {finite}
    """
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {rollups} (run_id, key, bucket, count, non_finite, min_step, min_value, min_timestamp,
                                   max_step, max_value, max_timestamp)
            SELECT g.run_id, g.key, g.bucket, g.n, g.n - g.finite, lo.step, lo.value, lo.timestamp,
                   hi.step, hi.value, hi.timestamp
            FROM (SELECT run_id, key, step / {ROLLUP_STEPS} AS bucket, COUNT(*) AS n,
                         SUM(CASE WHEN {finite} THEN 1 ELSE 0 END) AS finite
                  FROM {points} GROUP BY run_id, key, step / {ROLLUP_STEPS}) AS g
            LEFT JOIN ({ranked.format("ASC")}) AS lo
                ON lo.run_id = g.run_id AND lo.key = g.key AND lo.bucket = g.bucket AND lo.n = 1
            LEFT JOIN ({ranked.format("DESC")}) AS hi
                ON hi.run_id = g.run_id AND hi.key = g.key AND hi.bucket = g.bucket AND hi.n = 1
        """,
            [math.inf, -math.inf] * 3,
        )


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0010_run_liveness_mlflow_parity"),
    ]

    operations = [
        migrations.CreateModel(
            name="MetricRollup",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("key", models.CharField(max_length=250)),
                ("bucket", models.BigIntegerField()),
                ("count", models.BigIntegerField()),
                ("non_finite", models.BigIntegerField()),
                ("min_step", models.BigIntegerField(null=True)),
                ("min_value", models.FloatField(null=True)),
                ("min_timestamp", models.BigIntegerField(null=True)),
                ("max_step", models.BigIntegerField(null=True)),
                ("max_value", models.FloatField(null=True)),
                ("max_timestamp", models.BigIntegerField(null=True)),
                (
                    "run",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="metric_rollups",
                        to="runs.run",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("run", "key", "bucket"), name="metricrollup_unique_run_key_bucket")
                ],
            },
        ),
        migrations.RunPython(backfill_rollups, migrations.RunPython.noop),
    ]
