"""Django admin for Projects, members, Code, Datasets, Runs and metric points (docs/design/interfaces.md#surfaces).

The admin is the operators' view. State that services guard (a Run's status
and lineage, logged metric points) is shown read-only here: changes go
through the services, which keep the invariants (docs/design/house.md#immutable, #idempotent).
"""

from django.contrib import admin

from mado.admin import ReadOnlyAdmin
from runs.identities import identity_link, identity_unlink
from runs.models import (  # noqa: I001
    Code,
    CodeVersion,
    Dataset,
    DatasetVersion,
    DataStage,
    ExternalIdentity,
    LoggedModel,
    Membership,
    MetricBatch,
    MetricChunk,
    MetricRollup,
    MetricSummary,
    ParameterChange,
    Project,
    Run,
    RunTableColumns,
    RunTag,
    ServiceAccount,
)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    raw_id_fields = ["user"]
    readonly_fields = ["created_at"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "silent_run_timeout", "job_max_restarts", "created_at"]
    search_fields = ["name", "slug"]
    readonly_fields = ["created_at"]
    date_hierarchy = "created_at"
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "project", "role", "created_at"]
    list_filter = ["role", "project"]
    search_fields = ["user__username", "project__slug", "project__name"]
    raw_id_fields = ["user", "project"]
    list_select_related = ["user", "project"]
    readonly_fields = ["created_at"]


@admin.register(Code)
class CodeAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "created_by", "created_at"]
    list_filter = ["project"]
    search_fields = ["name", "project__slug"]
    raw_id_fields = ["project", "created_by"]
    list_select_related = ["project", "created_by"]
    readonly_fields = ["created_at"]


@admin.register(CodeVersion)
class CodeVersionAdmin(admin.ModelAdmin):
    """Versions are immutable once created: the entrypoint and archive are what Jobs ran."""

    list_display = ["code", "version", "entrypoint", "archive", "created_by", "created_at"]
    list_filter = ["code__project"]
    search_fields = ["code__name", "code__project__slug"]
    raw_id_fields = ["code", "archive", "created_by"]
    list_select_related = ["code", "archive", "created_by"]
    readonly_fields = ["code", "version", "entrypoint", "archive", "created_by", "created_at"]


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "created_at"]
    list_filter = ["project"]
    search_fields = ["name", "project__slug"]
    raw_id_fields = ["project"]
    list_select_related = ["project"]
    readonly_fields = ["created_at"]


@admin.register(DatasetVersion)
class DatasetVersionAdmin(admin.ModelAdmin):
    list_display = ["dataset", "version", "uri", "created_at"]
    list_filter = ["dataset__project"]
    search_fields = ["version", "uri", "dataset__name", "dataset__project__slug"]
    raw_id_fields = ["dataset"]
    list_select_related = ["dataset"]
    readonly_fields = ["created_at"]


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Status changes go through ``run_set_status`` (conditional UPDATE); lineage is immutable
    (docs/design/resume.md#lineage)."""

    list_display = ["id", "external_id", "name", "project", "kind", "status", "created_by", "started_at", "ended_at"]
    list_display_links = ["id", "external_id"]
    list_filter = ["status", "kind", "project"]
    search_fields = ["external_id", "name", "project__slug", "created_by__username"]
    raw_id_fields = ["project", "created_by", "code_version", "parent", "source_checkpoint", "input_dataset_versions"]
    list_select_related = ["project", "created_by"]
    date_hierarchy = "created_at"
    readonly_fields = [
        "project",
        "external_id",
        "kind",
        "status",
        "created_by",
        "code_version",
        "parent",
        "source_checkpoint",
        "input_dataset_versions",
        "heartbeat_at",
        "created_at",
        "started_at",
        "ended_at",
        # Facts the jobs app writes (docs/design/house.md#arrows): an edit would open reopen-by-id to members,
        # data stages after the Job's end, or spare a dead Run from the crash reaper.
        "ran_as_job",
        "job_ended",
        "job_alive_until",
    ]

    def has_delete_permission(self, request, obj=None):
        # Deleting a Run would drop its checkpoints and artifacts outside the deletion rules
        # (docs/design/checkpoints.md#deletion).
        return False


@admin.register(MetricChunk)
class MetricChunkAdmin(ReadOnlyAdmin):
    """Metric points are a log, stored in chunks (``MetricChunk``): read-only; tables can be huge, so no full count.

    Chunks are listed in the order of their index (run, key, last step), with
    no page per chunk: a chunk's points are read on the Run page and the API.
    """

    list_display = ["run", "key", "first_step", "last_step", "count"]
    list_display_links = None
    ordering = ["run_id", "key", "last_step", "id"]
    sortable_by = ()  # a column header would sort the whole table
    search_fields = ["key", "run__external_id"]
    raw_id_fields = ["run"]
    list_select_related = ["run"]
    show_full_result_count = False
    readonly_fields = ["run", "key", "first_step", "last_step", "count"]


@admin.register(MetricSummary)
class MetricSummaryAdmin(ReadOnlyAdmin):
    """A run's per-key summary is kept by the metrics write path: read-only."""

    list_display = ["run", "key", "count", "last_step", "last_value", "min_value", "max_value"]
    search_fields = ["key", "run__external_id"]
    raw_id_fields = ["run"]
    list_select_related = ["run"]
    readonly_fields = [
        "run",
        "key",
        "count",
        "first_step",
        "last_step",
        "last_value",
        "min_value",
        "max_value",
        "first_timestamp",
        "last_timestamp",
    ]


@admin.register(MetricRollup)
class MetricRollupAdmin(ReadOnlyAdmin):
    """A run's per-key, per-step-bucket rollup is kept by the metrics write path: read-only."""

    list_display = ["run", "key", "bucket", "count", "non_finite", "min_value", "max_value"]
    search_fields = ["key", "run__external_id"]
    raw_id_fields = ["run"]
    list_select_related = ["run"]
    readonly_fields = [
        "run",
        "key",
        "bucket",
        "count",
        "non_finite",
        "min_step",
        "min_value",
        "min_timestamp",
        "max_step",
        "max_value",
        "max_timestamp",
    ]


@admin.register(MetricBatch)
class MetricBatchAdmin(admin.ModelAdmin):
    """Idempotency keys of metric batches already stored: read-only."""

    list_display = ["run", "key", "points", "created_at"]
    search_fields = ["key", "run__external_id"]
    raw_id_fields = ["run"]
    readonly_fields = ["run", "key", "points", "created_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(DataStage)
class DataStageAdmin(ReadOnlyAdmin):
    """Data stages are append-only (docs/design/house.md#immutable): read-only, recorded through
    ``data_stage_record``."""

    list_display = ["run", "start_step", "checkpoint", "created_by", "created_at"]
    list_filter = ["run__project"]
    search_fields = ["run__external_id", "run__name", "created_by__username"]
    list_select_related = ["run", "checkpoint", "created_by"]
    readonly_fields = ["run", "start_step", "dataset_versions", "checkpoint", "metadata", "created_by", "created_at"]


@admin.register(ParameterChange)
class ParameterChangeAdmin(ReadOnlyAdmin):
    """Parameter changes made by resumes with ``allow_param_change`` (docs/design/runs.md#resume-modes): an append-only
    record, read-only."""

    list_display = ["run", "key", "old_value", "new_value", "lease_token", "changed_by", "changed_at"]
    list_filter = ["run__project"]
    search_fields = ["key", "run__external_id", "run__name", "changed_by__username"]
    list_select_related = ["run", "changed_by"]
    readonly_fields = ["run", "key", "old_value", "new_value", "lease_token", "changed_by", "changed_at"]


@admin.register(RunTag)
class RunTagAdmin(admin.ModelAdmin):
    """Run tags set through the MLflow API (docs/design/interfaces.md#mlflow)."""

    list_display = ("run", "key", "value")
    search_fields = ("key", "value", "run__external_id")
    raw_id_fields = ("run",)


@admin.register(RunTableColumns)
class RunTableColumnsAdmin(admin.ModelAdmin):
    list_display = ("user", "project", "updated_at")
    list_filter = ("project",)
    raw_id_fields = ("user", "project")


@admin.register(LoggedModel)
class LoggedModelAdmin(ReadOnlyAdmin):
    """MLflow 3 logged models: written through the MLflow API only (their files are Artifacts)."""

    list_display = ["model_id", "name", "project", "run", "step", "status", "created_by", "created_at", "deleted_at"]
    list_filter = ["status", "project"]
    search_fields = ["model_id", "name", "run__external_id", "project__slug"]
    raw_id_fields = ["project", "run", "created_by"]
    list_select_related = ["project", "run", "created_by"]
    date_hierarchy = "created_at"


@admin.register(ServiceAccount)
class ServiceAccountAdmin(ReadOnlyAdmin):
    """Project-scoped non-human users; created and given tokens by Project admins on the members page."""

    list_display = ["name", "project", "user", "created_by", "created_at"]
    list_filter = ["project"]
    search_fields = ["name", "project__slug"]
    raw_id_fields = ["project", "user", "created_by"]
    list_select_related = ["project", "user", "created_by"]


@admin.register(ExternalIdentity)
class ExternalIdentityAdmin(admin.ModelAdmin):
    """Who each single sign-on subject signs in as (docs/deploy.md#single-sign-on). Adding a row binds a subject to
    an account by hand, the only way sign-on reaches a superuser or a service account; deleting one unbinds it (its
    next sign-in makes a new user). Both are audit records; a binding never changes in place."""

    list_display = ["subject", "issuer", "user", "linked_by", "created_at"]
    list_filter = ["linked_by", "issuer"]
    search_fields = ["subject", "user__username"]
    raw_id_fields = ["user"]
    fields = ["issuer", "subject", "user"]

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request, obj)

    def save_model(self, request, obj, form, change):
        obj.pk = identity_link(actor=request.user, user=obj.user, issuer=obj.issuer, subject=obj.subject).pk

    def delete_model(self, request, obj):
        identity_unlink(actor=request.user, identity=obj)

    def delete_queryset(self, request, queryset):
        for identity in queryset:
            identity_unlink(actor=request.user, identity=identity)
