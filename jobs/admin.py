"""Django admin for Queues (configured here), and Jobs, Run logs and Run tokens (read-only;
docs/design/interfaces.md#surfaces).

Queues are the execution targets admins configure. A Job's state only
changes through ``jobs.services`` (conditional updates that keep the Job and
its Run consistent), so Jobs, log chunks and tokens are shown without add,
change or delete; a token's key is shown shortened.
"""

from django.contrib import admin

from jobs.models import Job, Queue, RunLogChunk, RunToken
from mado.admin import ReadOnlyAdmin


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin):
    list_display = ["name", "runner", "image", "enabled", "description", "created_at"]
    list_filter = ["runner", "enabled"]
    search_fields = ["name", "description", "image"]
    list_editable = ["enabled"]


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "run",
        "project",
        "kind",
        "status",
        "queue",
        "created_by",
        "attempt",
        "max_retries",
        "exit_code",
        "worker_host",
        "heartbeat_at",
        "created_at",
        "ended_at",
    ]
    list_filter = ["status", "kind", "queue", "run__project"]
    search_fields = ["run__external_id", "run__name", "celery_task_id", "worker_host", "error", "created_by__username"]
    raw_id_fields = ["run", "code_version", "retry_of", "resumed_from", "created_by"]
    list_select_related = ["run__project", "queue", "created_by"]
    date_hierarchy = "created_at"

    @admin.display(ordering="run__project__slug")
    def project(self, job):
        return job.run.project


@admin.register(RunLogChunk)
class RunLogChunkAdmin(ReadOnlyAdmin):
    list_display = ["run", "seq", "size", "created_at"]
    list_filter = ["run__project"]
    search_fields = ["run__external_id", "text"]
    raw_id_fields = ["run"]
    list_select_related = ["run"]

    @admin.display(description="characters")
    def size(self, chunk):
        return len(chunk.text)


@admin.register(RunToken)
class RunTokenAdmin(ReadOnlyAdmin):
    list_display = ["short_key", "run", "user", "created_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["run__external_id", "user__username"]
    raw_id_fields = ["run", "user"]
    list_select_related = ["run", "user"]
    exclude = ["salt", "digest"]
    readonly_fields = ["short_key"]

    @admin.display(description="key")
    def short_key(self, token):
        return f"{token.prefix}…"
