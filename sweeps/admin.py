"""Django admin for Sweeps and their trials (docs/design/sweeps.md#sweeps, #requeue;
docs/design/interfaces.md#surfaces), registered by ``runs.admin``.

Read-only: a Sweep is created through ``sweep_create`` (which checks the
configuration) and a trial changes state only through claims, reports and
the Run lifecycle (``sweeps.services``, ``sweeps.hooks``).
"""

from django.contrib import admin

from mado.admin import ReadOnlyAdmin
from sweeps.models import Sweep, SweepTrial


@admin.register(Sweep)
class SweepAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "name",
        "project",
        "method",
        "metric_name",
        "metric_goal",
        "run_cap",
        "created_by",
        "created_at",
    ]
    list_display_links = ["id", "name"]
    list_filter = ["method", "project"]
    search_fields = ["name", "metric_name", "project__slug", "created_by__username"]
    list_select_related = ["project", "created_by"]
    readonly_fields = [
        "project",
        "name",
        "method",
        "parameters",
        "metric_name",
        "metric_goal",
        "program",
        "run_cap",
        "config",
        "created_by",
        "created_at",
    ]


@admin.register(SweepTrial)
class SweepTrialAdmin(ReadOnlyAdmin):
    list_display = ["sweep", "number", "state", "requeue_count", "agent", "lease_expires_at", "run"]
    list_filter = ["state", "sweep__project"]
    search_fields = ["run__external_id", "agent", "sweep__name"]
    list_select_related = ["sweep", "run"]
    readonly_fields = [
        "sweep",
        "number",
        "run",
        "parameters",
        "state",
        "requeue_count",
        "agent",
        "claimed_at",
        "lease_expires_at",
        "created_at",
    ]
