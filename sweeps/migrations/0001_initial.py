"""Sweep and SweepTrial, moved here from the runs app (``runs/0018``) over the tables they already have.

State only: ``runs_sweep``, ``runs_sweeptrial`` and ``runs_sweeptrial_earlier_runs``
keep their rows, indexes and constraints (``Meta.db_table``; the database
operations are empty). The content types ``runs.sweep`` / ``runs.sweeptrial``
are renamed to ``sweeps.*`` so the admin permissions granted on them stay.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MODELS = ("sweep", "sweeptrial")


def _relabel_content_types(apps, schema_editor, old, new):
    """The content types of ``MODELS`` under app ``old`` go to app ``new`` (their ids, so permissions, stay).

    None is renamed where ``new`` already has one (a database where it was created meanwhile).
    """
    ContentType = apps.get_model("contenttypes", "ContentType")
    types = ContentType.objects.db_manager(schema_editor.connection.alias)
    for model in MODELS:
        if not types.filter(app_label=new, model=model).exists():
            types.filter(app_label=old, model=model).update(app_label=new)
    ContentType.objects.clear_cache()


def content_types_to_sweeps(apps, schema_editor):
    _relabel_content_types(apps, schema_editor, old="runs", new="sweeps")


def content_types_to_runs(apps, schema_editor):
    _relabel_content_types(apps, schema_editor, old="sweeps", new="runs")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("runs", "0018_sweeps_move_to_sweeps_app"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Sweep",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.CharField(blank=True, max_length=200)),
                        (
                            "method",
                            models.CharField(
                                choices=[("grid", "grid"), ("random", "random"), ("bayes", "Bayesian (TPE)")],
                                max_length=10,
                            ),
                        ),
                        ("parameters", models.JSONField()),
                        ("metric_name", models.CharField(max_length=250)),
                        (
                            "metric_goal",
                            models.CharField(
                                choices=[("minimize", "minimize"), ("maximize", "maximize")],
                                default="minimize",
                                max_length=10,
                            ),
                        ),
                        ("program", models.JSONField(help_text="argv list")),
                        ("run_cap", models.PositiveIntegerField(blank=True, null=True)),
                        (
                            "config",
                            models.JSONField(blank=True, default=dict, help_text="the configuration as submitted"),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "created_by",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "project",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="sweeps", to="runs.project"
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_sweep",
                        "ordering": ["-created_at", "-id"],
                    },
                ),
                migrations.CreateModel(
                    name="SweepTrial",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("number", models.PositiveIntegerField()),
                        ("parameters", models.JSONField()),
                        (
                            "state",
                            models.CharField(
                                choices=[
                                    ("queued", "queued"),
                                    ("leased", "leased"),
                                    ("running", "running"),
                                    ("done", "done"),
                                ],
                                default="leased",
                                max_length=10,
                            ),
                        ),
                        ("requeue_count", models.PositiveIntegerField(default=0)),
                        ("retry_count", models.PositiveIntegerField(default=0)),
                        ("agent", models.CharField(blank=True, max_length=200)),
                        ("claimed_at", models.DateTimeField(blank=True, null=True)),
                        ("lease_expires_at", models.DateTimeField(blank=True, null=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "claimed_by",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "earlier_runs",
                            models.ManyToManyField(
                                blank=True,
                                db_table="runs_sweeptrial_earlier_runs",
                                related_name="retried_sweep_trials",
                                to="runs.run",
                            ),
                        ),
                        (
                            "run",
                            models.OneToOneField(
                                on_delete=django.db.models.deletion.CASCADE, related_name="sweep_trial", to="runs.run"
                            ),
                        ),
                        (
                            "sweep",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="trials", to="sweeps.sweep"
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_sweeptrial",
                        "ordering": ["sweep", "number"],
                    },
                ),
                migrations.AddConstraint(
                    model_name="sweep",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("method__in", ["grid", "random", "bayes"])), name="sweep_method_valid"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="sweep",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("metric_goal__in", ["minimize", "maximize"])),
                        name="sweep_metric_goal_valid",
                    ),
                ),
                migrations.AddIndex(
                    model_name="sweeptrial",
                    index=models.Index(fields=["sweep", "state"], name="sweeptrial_sweep_state_idx"),
                ),
                migrations.AddConstraint(
                    model_name="sweeptrial",
                    constraint=models.UniqueConstraint(
                        fields=("sweep", "number"), name="sweeptrial_unique_sweep_number"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="sweeptrial",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("state__in", ["queued", "leased", "running", "done"])),
                        name="sweeptrial_state_valid",
                    ),
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_types_to_sweeps, content_types_to_runs),
    ]
