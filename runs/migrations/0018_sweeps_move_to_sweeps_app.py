"""Sweep and SweepTrial move to the sweeps app (``sweeps/0001_initial``); their tables stay where they are.

Only the migration state changes: runs forgets the two models here and
``sweeps/0001_initial`` declares them again over the same tables
(``runs_sweep``, ``runs_sweeptrial``, ``runs_sweeptrial_earlier_runs``), so
no row, index or constraint is touched on PostgreSQL or SQLite.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0017_run_job_facts"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="SweepTrial"),
                migrations.DeleteModel(name="Sweep"),
            ],
            database_operations=[],
        ),
    ]
