"""What a user chose for their workspace pages (docs/design/interfaces.md#workspace): the runs table's columns per
Project."""

from django.conf import settings
from django.db import models

from runs.models.core import Project


class RunTableColumns(models.Model):
    """The runs-table columns ``user`` chose in ``project``: ``columns`` are column ids in order
    (``param:NAME``, ``metric:KEY:last|min|max``; ``runs.table.parse_columns`` reads them). One row per
    user and Project, held by the database; no row: the table's defaults."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    columns = models.JSONField(default=list)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "run table columns"
        constraints = [models.UniqueConstraint(fields=["user", "project"], name="runtablecolumns_unique_user_project")]

    def __str__(self):
        return f"{self.user_id}:{self.project_id}"
