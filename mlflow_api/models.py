"""The MLflow model registry: registered models, their versions and aliases (docs/api.md#model-registry).

A registered model belongs to one Project: the one its creator named with the
``mado.project`` tag, else the Project of its first version's source Run
(until then it is ``unplaced`` and only its creator sees it). Names are unique
across mado, as on an MLflow server, so ``models:/<name>@<alias>`` names one
model. A version points at what it was registered from: a logged model, a
Run's files (``source``) and, when promoted from a checkpoint, that
checkpoint, which then cannot be deleted (``Checkpoint.registered_as``).
"""

from django.conf import settings
from django.db import models
from django.db.models import Q

from checkpoints.models import Checkpoint
from mado import policy
from runs.models import LoggedModel, Project, Run


class RegisteredModelQuerySet(models.QuerySet):
    def visible_to(self, user):
        """Models of the user's Projects, and the user's own models not placed in a Project yet."""
        if user is None or not user.is_authenticated or not user.is_active:
            return self.none()
        return self.filter(
            policy.membership_q(user, role=policy.VIEWER, project_path="project")
            | Q(project__isnull=True, created_by=user)
        )


class RegisteredModel(models.Model):
    """A named model whose versions are numbered from 1; ``last_version`` is the highest number ever given (a
    deleted version's number is never given again)."""

    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="registered_models"
    )
    name = models.CharField(max_length=250, unique=True)
    description = models.TextField(blank=True)
    tags = models.JSONField(default=dict, blank=True, help_text="{key: value} strings")
    last_version = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = RegisteredModelQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class ModelVersion(models.Model):
    """Version ``version`` of a registered model: ``source`` is the URI it was registered from (what the client
    downloads unless it is a logged model's or a checkpoint's, see ``download_uri`` in the registry selectors)."""

    registered_model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    source = models.CharField(max_length=2048)
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    logged_model = models.ForeignKey(LoggedModel, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    checkpoint = models.ForeignKey(
        Checkpoint, null=True, blank=True, on_delete=models.RESTRICT, related_name="model_versions"
    )
    description = models.TextField(blank=True)
    tags = models.JSONField(default=dict, blank=True, help_text="{key: value} strings")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["registered_model", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["registered_model", "version"], name="model_version_unique_number"),
        ]

    def __str__(self):
        return f"{self.registered_model.name} v{self.version}"


class ModelAlias(models.Model):
    """``alias`` names one version of its model (``models:/<name>@<alias>``); setting it again moves it."""

    registered_model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="aliases")
    alias = models.CharField(max_length=255)
    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="aliases")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["alias"]
        constraints = [
            models.UniqueConstraint(fields=["registered_model", "alias"], name="model_alias_unique_name"),
        ]

    def __str__(self):
        return f"{self.registered_model.name}@{self.alias}"
