"""An index of the metric summaries by key: the runs table sorted by a metric (docs/design/interfaces.md#workspace)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0011_metric_rollup"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="metricsummary",
            index=models.Index(
                fields=["key", "run"],
                include=("last_value", "min_value", "max_value"),
                name="metricsummary_key_run_idx",
            ),
        ),
    ]
