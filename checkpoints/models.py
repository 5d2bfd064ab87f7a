"""Artifacts (stored files of a Run) and Checkpoints with their manifests
(docs/design/checkpoints.md#a-checkpoint, #keep-count, #deletion)."""

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import MD5

from runs.models import LoggedModel, Project, Run, VisibleQuerySet


class Artifact(models.Model):
    """A stored file: a Run's (``run``), a logged model's (``logged_model``), or a Code version's source archive (both
    NULL).

    ``storage_key`` names the bytes in the artifact storage; it is unique so two
    rows never share (and a delete never removes) another row's bytes.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="artifacts")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="artifacts")
    logged_model = models.ForeignKey(
        LoggedModel,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="artifacts",
        help_text="set (with run NULL) for a file of an MLflow logged model",
    )
    path = models.CharField(max_length=1024)
    size = models.BigIntegerField(help_text="bytes")
    sha256 = models.CharField(max_length=64)
    storage_key = models.CharField(max_length=1024, unique=True)
    stored_fingerprint = models.CharField(
        max_length=300,
        blank=True,
        help_text="the stored object's stat (storage.StoredStat) when its bytes were last read back whole and matched",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    history = models.JSONField(
        default=list,
        blank=True,
        help_text="earlier contents replaced through the MLflow API: [{sha256, size, replaced_at}], oldest first",
    )

    objects = VisibleQuerySet.as_manager()

    class Meta:
        ordering = ["path"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "path"], condition=Q(run__isnull=False), name="artifact_unique_run_path"
            ),
            models.UniqueConstraint(
                fields=["logged_model", "path"],
                condition=Q(logged_model__isnull=False),
                name="artifact_unique_logged_model_path",
            ),
            models.CheckConstraint(condition=Q(size__gte=0), name="artifact_size_non_negative"),
        ]

    def __str__(self):
        return self.path


class CheckpointState(models.TextChoices):
    PENDING = "pending", "pending"
    COMPLETE = "complete", "complete"
    DELETED = "deleted", "deleted"
    # Nobody will finish it (its Run ended, its upload lease expired, its verification never ran): ``error`` says
    # why; a later registration of the same step replaces it.
    ERROR = "error", "error"
    # Complete once, but a scrub found its stored bytes altered or gone: ``error`` says how; never usable again.
    CORRUPT = "corrupt", "corrupt"


USABLE_STATES = frozenset({CheckpointState.COMPLETE})


class CheckpointQuerySet(VisibleQuerySet):
    project_path = "run__project"

    def usable(self):
        """Only checkpoints that can be resumed, continued or downloaded (complete; not pending, not deleted)."""
        return self.filter(state__in=USABLE_STATES)


class CheckpointLayout(models.TextChoices):
    """How a checkpoint's bytes are stored: one tar Artifact (the SDK) or one Artifact per file (MLflow,
    docs/design/checkpoints.md#mlflow-checkpoints)."""

    TAR = "tar", "tar"
    FILES = "files", "files"


class Checkpoint(models.Model):
    """A directory saved at ``step`` (steps completed), stored as one tar artifact
    (docs/design/checkpoints.md#a-checkpoint).

    Immutable once complete; ``(run, step)`` is unique (docs/design/house.md#immutable).
    Only ``complete`` checkpoints are usable. While ``pending``:
    ``received`` holds what the server itself computed from the uploaded
    bytes (``{"storage_key", "size", "sha256", "members": [{path, size,
    sha256}]}``; for a direct S3 upload first ``{"storage_key", "upload_id",
    "part_size", "tar_size"}``, then ``"uploaded": true``), ``declared`` the
    client's declaration awaiting the verification task (``{"tar_size",
    "tar_sha256", "manifest"}``) and ``error`` why the last attempt failed.
    Once complete, the files are ManifestEntry rows, the tar an Artifact, and
    ``received`` keeps only ``{"size", "sha256"}``. With ``layout="files"``
    (uploaded by the MLflow client, docs/design/checkpoints.md#mlflow-checkpoints) there is no tar: each
    ManifestEntry points at the Artifact holding that file, rows are added
    while pending, and ``tar_size``/``tar_sha256``/``artifact`` stay empty.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.BigIntegerField()
    framework = models.CharField(max_length=50, blank=True)
    world_size = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="processes that wrote a sharded torch-dcp checkpoint: every rank's shard must be in it",
    )
    includes_optimizer = models.BooleanField(default=False)
    file_count = models.PositiveIntegerField(default=0)
    total_bytes = models.BigIntegerField(default=0, help_text="sum of the files' sizes, bytes")
    artifact = models.ForeignKey(Artifact, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    tar_sha256 = models.CharField(max_length=64, blank=True)
    tar_size = models.BigIntegerField(null=True, blank=True, help_text="bytes")
    state = models.CharField(max_length=10, choices=CheckpointState.choices, default=CheckpointState.PENDING)
    layout = models.CharField(
        max_length=5,
        choices=CheckpointLayout.choices,
        default=CheckpointLayout.TAR,
        help_text="tar: one tar artifact; files: one artifact per manifest entry (MLflow log_artifacts)",
    )
    idempotency_key = models.CharField(
        max_length=200, null=True, blank=True, help_text="the registering request's Idempotency-Key (unique per run)"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    metadata = models.JSONField(
        default=dict, blank=True, help_text="what the saving code said about it: training_state, preemption"
    )
    received = models.JSONField(default=dict, blank=True, help_text="what the server computed from the uploaded tar")
    declared = models.JSONField(null=True, blank=True, help_text="declaration awaiting the S3 verification task")
    error = models.TextField(blank=True, help_text="why the last upload or verification failed")
    lease_token = models.BigIntegerField(
        default=0,
        help_text="the Run's fencing token when registered: a pending checkpoint of an older writer can be taken over",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    verified_at = models.DateTimeField(
        null=True, blank=True, help_text="when a scrub last read the stored bytes back and they matched"
    )
    deleted_at = models.DateTimeField(null=True, blank=True)
    deleted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    registered_as = models.CharField(
        max_length=300,
        blank=True,
        help_text="the model versions registered from it, kept by the model registry: while set, it cannot be deleted",
    )

    objects = CheckpointQuerySet.as_manager()

    class Meta:
        ordering = ["run", "-step"]
        constraints = [
            models.UniqueConstraint(fields=["run", "step"], name="checkpoint_unique_run_step"),
            models.UniqueConstraint(
                fields=["run", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="checkpoint_unique_run_idempotency_key",
            ),
            models.CheckConstraint(condition=Q(step__gte=0), name="checkpoint_step_non_negative"),
            models.CheckConstraint(condition=Q(state__in=CheckpointState.values), name="checkpoint_state_valid"),
        ]

    def __str__(self):
        return f"{self.run} @ step {self.step}"

    @property
    def signal_to_complete_s(self) -> float | None:
        """Seconds from the preemption signal (``metadata.preemption.signal_at``) to ``complete``; None when the
        checkpoint was not saved on a signal or is not complete (docs/design/checkpoints.md#metadata)."""
        preemption = (self.metadata or {}).get("preemption")
        signal_at = preemption.get("signal_at") if isinstance(preemption, dict) else None
        if self.completed_at is None or signal_at is None:
            return None
        return round(self.completed_at.timestamp() - signal_at, 3)

    @property
    def artifact_path(self) -> str:
        """The Run artifact path of the tar (docs/design/checkpoints.md#a-checkpoint)."""
        return f"checkpoints/step-{self.step}.tar"

    @property
    def stored_bytes(self) -> int:
        """Bytes this checkpoint holds in the storage: its tar, or its files (``layout="files"``)."""
        return self.total_bytes if self.layout == "files" else (self.tar_size or 0)

    @property
    def is_usable(self) -> bool:
        return self.state in USABLE_STATES

    @property
    def is_deleted(self) -> bool:
        return self.state == CheckpointState.DELETED


class ManifestEntry(models.Model):
    """One file of a Checkpoint: relative path, SHA-256 and size in bytes (docs/design/checkpoints.md#a-checkpoint;
    docs/design/worker.md#verify)."""

    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="manifest")
    # Up to MADO_TAR_MAX_PATH_BYTES (4,096 by default) bytes: too long for a B-tree index entry, so the unique
    # index is on the path's MD5 (the tar reader already refused duplicate and colliding names,
    # docs/design/worker.md#verify).
    path = models.TextField()
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField(help_text="bytes")
    artifact = models.ForeignKey(
        Artifact,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="layout files only: the Run artifact holding this file's bytes (protected from a plain delete)",
    )

    class Meta:
        ordering = ["path"]
        constraints = [
            models.UniqueConstraint(F("checkpoint"), MD5("path"), name="manifest_unique_checkpoint_path_md5")
        ]

    def __str__(self):
        return self.path


class RetentionPolicy(models.Model):
    """A Project's retention rules (docs/design/checkpoints.md#retention): which complete checkpoints each Run keeps
    when an admin applies the policy; the others are deleted unless a deletion protection holds them.

    A rule left empty keeps nothing by itself; at least one rule is set (the service checks). ``scheduled``: beat
    applies the policy every day (only after an admin opted in).
    """

    class BestMode(models.TextChoices):
        MIN = "min", "lowest"
        MAX = "max", "highest"

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="retention_policy")
    keep_last = models.PositiveIntegerField(null=True, blank=True, help_text="the newest N of each Run, by step")
    keep_best = models.PositiveIntegerField(null=True, blank=True, help_text="the best K of each Run by best_metric")
    best_metric = models.CharField(max_length=250, blank=True)
    best_mode = models.CharField(max_length=3, choices=BestMode.choices, default=BestMode.MIN)
    keep_every = models.PositiveIntegerField(null=True, blank=True, help_text="steps that are a multiple of k")
    keep_newer_days = models.PositiveIntegerField(null=True, blank=True, help_text="created within D days")
    scheduled = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    last_applied_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"retention of {self.project}"


class CheckpointDeletion(models.Model):
    """What a deletion removed, who and why (docs/design/checkpoints.md#deletion): one row per deleted checkpoint."""

    class Cause(models.TextChoices):
        HAND = "hand", "deleted by hand"
        BULK = "bulk", "bulk delete from the Runs table"
        POLICY = "policy", "retention policy applied"
        SCHEDULE = "schedule", "scheduled retention policy"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="checkpoint_deletions")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoint_deletions")
    checkpoint = models.OneToOneField("Checkpoint", on_delete=models.CASCADE, related_name="deletion")
    step = models.BigIntegerField()
    bytes = models.BigIntegerField(help_text="bytes removed from the storage")
    cause = models.CharField(max_length=10, choices=Cause.choices)
    deleted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    deleted_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-deleted_at", "-pk"]

    def __str__(self):
        return f"step {self.step} of run {self.run_id}: {self.cause}"


class StorageUsage(models.Model):
    """Bytes and files stored, per Project, Run (NULL: none, e.g. a Code archive) and kind; kept current by the
    services that store and delete artifacts, never by a scan (docs/design/checkpoints.md#usage)."""

    class Kind(models.TextChoices):
        CHECKPOINT_TAR = "tar", "checkpoint tars"
        CHECKPOINT_FILES = "files", "checkpoint files"
        LOGGED_MODEL = "model", "logged models"
        ARTIFACT = "artifact", "other artifacts"
        CODE = "code", "code archives"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="storage_usage")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="storage_usage")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    bytes = models.BigIntegerField(default=0)
    files = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "run", "kind"], condition=Q(run__isnull=False), name="storageusage_unique_run"
            ),
            models.UniqueConstraint(
                fields=["project", "kind"], condition=Q(run__isnull=True), name="storageusage_unique_project"
            ),
        ]

    def __str__(self):
        return f"{self.kind} of run {self.run_id}: {self.bytes} bytes"


class ScrubState(models.Model):
    """The scrub's one row (docs/design/checkpoints.md#scrubbing): bytes it may still read (``credit``, earned at
    ``MADO_SCRUB_BYTES_PER_HOUR``) and when it last earned; locked by each pass, so passes never overlap."""

    credit = models.FloatField(default=0.0, help_text="bytes")
    updated_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"scrub credit {self.credit:.0f} bytes"
