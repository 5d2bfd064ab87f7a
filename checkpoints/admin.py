"""Django admin for Artifacts, Checkpoints and manifests: read-only (docs/design/checkpoints.md#a-checkpoint, #deletion;
docs/design/interfaces.md#surfaces).

A Checkpoint is immutable and an artifact may only be deleted by a Project
admin through the service that checks the keep count and the runs that use it
(race-free, docs/design/checkpoints.md#deletion); the admin therefore shows these rows without add, change or
delete.
"""

from django.contrib import admin

from checkpoints.models import Artifact, Checkpoint, ManifestEntry
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
