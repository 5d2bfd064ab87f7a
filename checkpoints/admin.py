"""Django admin for Artifacts, Checkpoints and manifests: read-only (docs/design/checkpoints.md#a-checkpoint, #deletion;
docs/design/interfaces.md#surfaces).

A Checkpoint is immutable and an artifact may only be deleted by a Project
admin through the service that checks the keep count and the runs that use it
(race-free, docs/design/checkpoints.md#deletion); the admin therefore shows these rows without add, change or
delete.
"""

from django.contrib import admin

from checkpoints.models import (
    Artifact,
    Checkpoint,
    CheckpointDeletion,
    ManifestEntry,
    RetentionPolicy,
    ScrubState,
    StorageUsage,
)
from mado.admin import ReadOnlyAdmin


@admin.register(Artifact)
class ArtifactAdmin(ReadOnlyAdmin):
    list_display = ["path", "project", "run", "logged_model", "size", "sha256", "created_at"]
    list_filter = ["project"]
    search_fields = ["path", "sha256", "storage_key", "run__external_id", "logged_model__model_id", "project__slug"]
    raw_id_fields = ["project", "run", "logged_model"]
    list_select_related = ["project", "run", "logged_model"]
    date_hierarchy = "created_at"


class ManifestEntryInline(admin.TabularInline):
    model = ManifestEntry
    extra = 0
    fields = ["path", "size", "sha256"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "run",
        "step",
        "state",
        "file_count",
        "total_bytes",
        "includes_optimizer",
        "framework",
        "created_at",
    ]
    list_filter = ["state", "includes_optimizer", "framework", "run__project"]
    search_fields = ["run__external_id", "run__name", "tar_sha256"]
    raw_id_fields = ["run", "artifact"]
    list_select_related = ["run"]
    date_hierarchy = "created_at"
    inlines = [ManifestEntryInline]


@admin.register(ManifestEntry)
class ManifestEntryAdmin(ReadOnlyAdmin):
    list_display = ["path", "checkpoint", "size", "sha256"]
    search_fields = ["path", "sha256"]
    raw_id_fields = ["checkpoint"]
    list_select_related = ["checkpoint__run"]


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(ReadOnlyAdmin):
    """Set and applied by Project admins on the Storage page (docs/design/checkpoints.md#retention)."""

    list_display = ["project", "keep_last", "keep_best", "best_metric", "keep_every", "keep_newer_days", "scheduled"]
    list_filter = ["scheduled"]
    raw_id_fields = ["project", "updated_by"]
    list_select_related = ["project"]


@admin.register(CheckpointDeletion)
class CheckpointDeletionAdmin(ReadOnlyAdmin):
    """What each deletion removed, who and why (docs/design/checkpoints.md#deletion)."""

    list_display = ["checkpoint", "project", "run", "step", "bytes", "cause", "deleted_by", "deleted_at"]
    list_filter = ["cause", "project"]
    raw_id_fields = ["project", "run", "checkpoint", "deleted_by"]
    list_select_related = ["project", "run", "deleted_by"]
    date_hierarchy = "deleted_at"


@admin.register(StorageUsage)
class StorageUsageAdmin(ReadOnlyAdmin):
    """Bytes stored per Project, Run and kind, kept by the services that store and delete
    (docs/design/checkpoints.md#usage)."""

    list_display = ["project", "run", "kind", "bytes", "files"]
    list_filter = ["kind", "project"]
    raw_id_fields = ["project", "run"]
    list_select_related = ["project", "run"]


@admin.register(ScrubState)
class ScrubStateAdmin(ReadOnlyAdmin):
    """The scrubber's byte credit (docs/design/checkpoints.md#scrubbing)."""

    list_display = ["id", "credit", "updated_at"]
