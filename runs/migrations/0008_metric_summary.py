"""The per-run, per-key metric summary, filled from the points already stored; history index ordered by (step, id)."""

import django.db.models.deletion
from django.db import migrations, models


def backfill_summaries(apps, schema_editor):
    """One summary row per (run, key) that has points: the same figures ``metrics_ingest`` keeps current."""
    points = apps.get_model("runs", "MetricPoint")._meta.db_table
    summaries = apps.get_model("runs", "MetricSummary")._meta.db_table
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"""
            INSERT INTO {summaries} (run_id, key, count, first_step, last_step, min_value, max_value,
                                     first_timestamp, last_timestamp)
            SELECT run_id, key, COUNT(*), MIN(step), MAX(step), MIN(value), MAX(value), MIN(timestamp), MAX(timestamp)
            FROM {points} GROUP BY run_id, key
        """)
        cursor.execute(f"""
            UPDATE {summaries} SET last_value = (
                SELECT p.value FROM {points} p WHERE p.run_id = {summaries}.run_id AND p.key = {summaries}.key
                ORDER BY p.step DESC, p.id DESC LIMIT 1)
        """)


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0007_project_members_may_resume_trial_claimed_by"),
    ]

    operations = [
        migrations.CreateModel(
            name="MetricSummary",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("key", models.CharField(max_length=250)),
                ("count", models.BigIntegerField()),
                ("first_step", models.BigIntegerField()),
                ("last_step", models.BigIntegerField()),
                ("last_value", models.FloatField(null=True)),
                ("min_value", models.FloatField(null=True)),
                ("max_value", models.FloatField(null=True)),
                ("first_timestamp", models.BigIntegerField()),
                ("last_timestamp", models.BigIntegerField()),
            ],
        ),
        migrations.RemoveIndex(
            model_name="metricpoint",
            name="metric_run_key_step_idx",
        ),
        migrations.AddIndex(
            model_name="metricpoint",
            index=models.Index(fields=["run", "key", "step", "id"], name="metric_run_key_step_id_idx"),
        ),
        migrations.AddField(
            model_name="metricsummary",
            name="run",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, related_name="metric_summaries", to="runs.run"
            ),
        ),
        migrations.AddConstraint(
            model_name="metricsummary",
            constraint=models.UniqueConstraint(fields=("run", "key"), name="metricsummary_unique_run_key"),
        ),
        migrations.RunPython(backfill_summaries, migrations.RunPython.noop),
    ]
