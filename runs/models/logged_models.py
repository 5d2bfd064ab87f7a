"""MLflow 3 logged models (docs/design/interfaces.md#mlflow): a model a Run (or a script without one) logged, with its
files.

The files are Artifacts (``checkpoints.models.Artifact.logged_model``), stored
and streamed like a Run's; a logged model links to the Run that produced it
and the step it was logged at.
"""

from django.conf import settings
from django.db import models

from runs.models.core import Project, Run, VisibleQuerySet


class LoggedModelStatus(models.TextChoices):
    PENDING = "pending", "pending"
    READY = "ready", "ready"
    UPLOAD_FAILED = "upload_failed", "upload failed"


class LoggedModel(models.Model):
    """One MLflow logged model: ``model_id`` (``m-`` + 32 hex) is what the client names it by.

    ``run`` is the source Run (None: logged outside a run) and ``step`` the
    step it was logged at (MLflow's ``LoggedModelOutput.step``). ``tags`` and
    ``params`` are ``{key: value}`` strings; ``deleted_at`` is MLflow's soft delete.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="logged_models")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="logged_models")
    step = models.BigIntegerField(default=0, help_text="the source Run's step the model was logged at")
    model_id = models.CharField(max_length=40, unique=True)
    name = models.CharField(max_length=250)
    model_type = models.CharField(max_length=250, blank=True)
    status = models.CharField(max_length=20, choices=LoggedModelStatus.choices, default=LoggedModelStatus.PENDING)
    status_message = models.TextField(blank=True)
    tags = models.JSONField(default=dict, blank=True)
    params = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    deleted_at = models.DateTimeField(null=True, blank=True, help_text="soft-deleted (MLflow delete_logged_model)")

    objects = VisibleQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.name} ({self.model_id})"
