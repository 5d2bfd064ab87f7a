"""Artifacts (stored files of a Run) and Checkpoints with their manifests (SPEC F1, F4, F5)."""

from django.db import models
from django.db.models import Q

from runs.models import Project, Run, VisibleQuerySet


class Artifact(models.Model):
    """A stored file. ``run`` is set for a Run's files; NULL for a Code version's source archive.

    ``storage_key`` names the bytes in the artifact storage; it is unique so two
    rows never share (and a delete never removes) another row's bytes.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="artifacts")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="artifacts")
    path = models.CharField(max_length=1024)
    size = models.BigIntegerField(help_text="bytes")
    sha256 = models.CharField(max_length=64)
    storage_key = models.CharField(max_length=1024, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = VisibleQuerySet.as_manager()

    class Meta:
        ordering = ["path"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "path"], condition=Q(run__isnull=False), name="artifact_unique_run_path"
            ),
            models.CheckConstraint(condition=Q(size__gte=0), name="artifact_size_non_negative"),
        ]

    def __str__(self):
        return self.path


class CheckpointState(models.TextChoices):
    PENDING = "pending", "pending"
    COMPLETE = "complete", "complete"
    DELETED = "deleted", "deleted"


class CheckpointQuerySet(VisibleQuerySet):
    project_path = "run__project"


class Checkpoint(models.Model):
    """A directory saved at ``step`` (steps completed), stored as one tar artifact (SPEC F1).

    Immutable once complete; ``(run, step)`` is unique (ARCHITECTURE rule 2).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.BigIntegerField()
    framework = models.CharField(max_length=50, blank=True)
    includes_optimizer = models.BooleanField(default=False)
    file_count = models.PositiveIntegerField(default=0)
    total_bytes = models.BigIntegerField(default=0, help_text="sum of the files' sizes, bytes")
    artifact = models.ForeignKey(Artifact, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    tar_sha256 = models.CharField(max_length=64, blank=True)
    tar_size = models.BigIntegerField(null=True, blank=True, help_text="bytes")
    state = models.CharField(max_length=10, choices=CheckpointState.choices, default=CheckpointState.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = CheckpointQuerySet.as_manager()

    class Meta:
        ordering = ["run", "-step"]
        constraints = [
            models.UniqueConstraint(fields=["run", "step"], name="checkpoint_unique_run_step"),
            models.CheckConstraint(condition=Q(step__gte=0), name="checkpoint_step_non_negative"),
            models.CheckConstraint(condition=Q(state__in=CheckpointState.values), name="checkpoint_state_valid"),
        ]

    def __str__(self):
        return f"{self.run} @ step {self.step}"


class ManifestEntry(models.Model):
    """One file of a Checkpoint: relative path, SHA-256 and size in bytes (SPEC F1, F13)."""

    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="manifest")
    path = models.CharField(max_length=1024)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField(help_text="bytes")

    class Meta:
        ordering = ["path"]
        constraints = [
            models.UniqueConstraint(fields=["checkpoint", "path"], name="manifest_unique_checkpoint_path")
        ]

    def __str__(self):
        return self.path
