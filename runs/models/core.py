"""Projects, members, Code, Datasets, Runs and idempotent metric batches (docs/design/resume.md#steps-continue;
docs/design/runs.md#resume-modes, #one-writer-process, #states; docs/design/interfaces.md#surfaces)."""

import secrets

from django.conf import settings
from django.core.validators import MaxValueValidator
from django.db import models
from django.db.models import Q

from mado import policy


class VisibleQuerySet(models.QuerySet):
    """Restrict rows to the user's Projects (docs/design/house.md#one-policy).

    Subclasses set ``project_path``: the lookup from the model to its Project.
    The join to the user's membership adds no row (one membership per user
    and Project, ``membership_unique_user_project``), so no ``DISTINCT``:
    that would cost every lookup, the metrics POST's included, a grouping
    of all selected columns to plan and run. A caller that filters across a
    multi-valued relation (tags, trials) adds its own ``.distinct()``, as
    ``runs.table`` does.
    """

    project_path = "project"

    def visible_to(self, user):
        return self.filter(policy.membership_q(user, role=policy.VIEWER, project_path=self.project_path))

    def editable_by(self, user):
        return self.filter(policy.membership_q(user, role=policy.MEMBER, project_path=self.project_path))

    def administered_by(self, user):
        return self.filter(policy.membership_q(user, role=policy.ADMIN, project_path=self.project_path))


class ProjectQuerySet(VisibleQuerySet):
    project_path = ""


class Project(models.Model):
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    members_may_resume = models.BooleanField(
        default=False,
        help_text="any member may reopen a Run of this project by its id (POST runs/ with resume), not only its "
        "writers; never a Run that ran as a Job",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    tags = models.JSONField(default=dict, blank=True, help_text="experiment tags set through the MLflow API")
    # MLflow's experiment 0: each user's "Default" Project, made on first use; unique, so two first uses make one.
    default_for = models.OneToOneField(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="default_project"
    )
    job_max_restarts = models.PositiveIntegerField(
        default=0,
        validators=[MaxValueValidator(10)],
        help_text="automatic restarts a Job launched without max_restarts gets: resumes from its latest checkpoint "
        "after a preemption or a lost worker (docs/design/resume.md#restarts)",
    )
    silent_run_timeout = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="seconds without any write after which a Run that sends no heartbeats becomes crashed "
        "(empty: the server's MMT_SILENT_RUN_TIMEOUT)",
    )

    objects = ProjectQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.slug


class Role(models.TextChoices):
    ADMIN = policy.ADMIN, "admin"
    MEMBER = policy.MEMBER, "member"
    VIEWER = policy.VIEWER, "viewer"


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = VisibleQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "project"], name="membership_unique_user_project"),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="membership_role_valid"),
        ]

    def __str__(self):
        return f"{self.user} in {self.project} ({self.role})"


class Code(models.Model):
    """A registered training program; its versions are what Jobs run."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="codes")
    name = models.CharField(max_length=200)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = VisibleQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="code_unique_project_name")]

    def __str__(self):
        return self.name


class CodeVersionQuerySet(VisibleQuerySet):
    project_path = "code__project"


class CodeVersion(models.Model):
    """One immutable version of a Code: source archive + entrypoint argv (a list of strings)."""

    code = models.ForeignKey(Code, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    entrypoint = models.JSONField(help_text="argv list, e.g. ['python', 'train.py']")
    archive = models.ForeignKey(
        "checkpoints.Artifact", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = CodeVersionQuerySet.as_manager()

    class Meta:
        ordering = ["code", "-version"]
        constraints = [models.UniqueConstraint(fields=["code", "version"], name="codeversion_unique_code_version")]

    def __str__(self):
        return f"{self.code.name} v{self.version}"


class Dataset(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = VisibleQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="dataset_unique_project_name")]

    def __str__(self):
        return self.name


class DatasetVersionQuerySet(VisibleQuerySet):
    project_path = "dataset__project"


class DatasetVersion(models.Model):
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions")
    version = models.CharField(max_length=100)
    uri = models.CharField(max_length=2000, blank=True)
    description = models.TextField(blank=True)
    mlflow_dataset = models.JSONField(
        default=dict, blank=True, help_text="as logged through MLflow's log_input: source_type, schema, profile"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = DatasetVersionQuerySet.as_manager()

    class Meta:
        ordering = ["dataset", "-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["dataset", "version"], name="datasetversion_unique_dataset_version")
        ]

    def __str__(self):
        return f"{self.dataset.name}:{self.version}"


class RunKind(models.TextChoices):
    TRAINING = "training", "training"
    FINE_TUNING = "fine_tuning", "fine-tuning"
    EVALUATION = "evaluation", "evaluation"
    OTHER = "other", "other"


class RunStatus(models.TextChoices):
    PENDING = "pending", "pending"
    RUNNING = "running", "running"
    FINISHED = "finished", "finished"
    FAILED = "failed", "failed"
    ABORTED = "aborted", "aborted"
    CRASHED = "crashed", "crashed"
    PREEMPTING = "preempting", "preempting"
    PREEMPTED = "preempted", "preempted"


FINAL_STATES = frozenset(
    {RunStatus.FINISHED, RunStatus.FAILED, RunStatus.ABORTED, RunStatus.CRASHED, RunStatus.PREEMPTED}
)


def new_external_id() -> str:
    """A W&B-style run id: 8 lowercase letters and digits."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(8))


class Run(models.Model):
    """One execution of training code. Inputs are its initial configuration, never overwritten."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="runs")
    external_id = models.CharField(
        max_length=128, default=new_external_id, help_text="run id, unique per project (same-run resume)"
    )
    name = models.CharField(max_length=200, blank=True)
    kind = models.CharField(max_length=20, choices=RunKind.choices, default=RunKind.TRAINING)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.RUNNING)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="runs")
    parameters = models.JSONField(default=dict, blank=True)
    input_dataset_versions = models.ManyToManyField(DatasetVersion, blank=True, related_name="runs")
    code_version = models.ForeignKey(CodeVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="runs")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    source_checkpoint = models.ForeignKey(
        "checkpoints.Checkpoint", null=True, blank=True, on_delete=models.PROTECT, related_name="derived_runs"
    )
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # Same-run resume (docs/design/runs.md#resume-modes, #one-writer-process): the process writing to this Run holds a
    # lease. Every start or resume takes a new fencing token; a write that carries an older one is refused, so a stale
    # process cannot write after another took over.
    lease_token = models.BigIntegerField(
        default=0, help_text="fencing token of the current writer (0: never started by the SDK)"
    )
    writer_host = models.CharField(max_length=255, blank=True, help_text="host name of the current writer")
    writer_pid = models.IntegerField(null=True, blank=True, help_text="process id of the current writer")
    writer_since = models.DateTimeField(null=True, blank=True, help_text="when the current writer started or resumed")
    resume_count = models.PositiveIntegerField(default=0, help_text="how many times the Run was resumed under its id")
    step_floor = models.BigIntegerField(default=0, help_text="points at a lower step are dropped (set by a resume)")
    dropped_points = models.BigIntegerField(
        default=0, help_text="points dropped because their step was below step_floor"
    )
    # Liveness of writers that send no heartbeats (docs/design/runs.md#liveness): the time of the Run's last write of
    # any kind.
    last_write_at = models.DateTimeField(
        null=True, blank=True, help_text="last write of any kind (metrics, params, files)"
    )
    ended_reason = models.CharField(max_length=500, blank=True, help_text="why the server ended the Run (e.g. crashed)")
    deleted_at = models.DateTimeField(null=True, blank=True, help_text="soft-deleted (MLflow delete_run); restorable")
    # Facts about the Run's Job, written by the jobs app when they become true (docs/design/house.md#arrows):
    # runs reads them and never asks. Each defaults to the answer that grants nothing.
    ran_as_job = models.BooleanField(default=False, help_text="a Job runs or ran this Run (its writers reopen it)")
    job_ended = models.BooleanField(default=False, help_text="the Run's Job reached a final state")
    job_alive_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="the Job's worker vouches for the Run until then (its last heartbeat + timeout)",
    )

    objects = VisibleQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "external_id"], name="run_unique_project_external_id"),
            models.CheckConstraint(condition=Q(kind__in=RunKind.values), name="run_kind_valid"),
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="run_status_valid"),
        ]
        indexes = [
            models.Index(fields=["project", "status", "kind", "-created_at"], name="run_project_filter_idx"),
            # The runs table's default order (newest first): its first page reads 25 index entries, not every Run.
            models.Index(fields=["project", "-created_at", "-id"], name="run_project_newest_idx"),
        ]

    def __str__(self):
        return self.name or self.external_id

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATES

    @property
    def duration_seconds(self) -> float | None:
        if not self.started_at:
            return None
        end = self.ended_at or self.heartbeat_at or self.started_at
        return max((end - self.started_at).total_seconds(), 0.0)


class MetricBatch(models.Model):
    """A metrics batch sent with an ``Idempotency-Key``: a retried or re-synced batch is stored once.

    The row is inserted in the same transaction as the batch's points, so the
    unique constraint decides between two concurrent copies of one batch.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_batches")
    key = models.CharField(max_length=200)
    points = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="metricbatch_unique_run_key")]

    def __str__(self):
        return f"{self.run_id}:{self.key}"


class DataStageQuerySet(VisibleQuerySet):
    project_path = "run__project"


class DataStage(models.Model):
    """From ``start_step`` on, the Run trained on exactly ``dataset_versions``
    (docs/design/runs.md#data-stages, #data-stages-sdk).

    Append-only: ``runs.stages.data_stage_record`` is the only writer and
    there is no update or delete path (API, pages, admin). One stage per
    ``(run, start_step)``, held by the database, so two concurrent records at
    one step cannot both win. ``checkpoint`` (optional) is a checkpoint of the
    same Run whose step is at most ``start_step``. The Run's own
    ``input_dataset_versions`` stay its initial configuration.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="data_stages")
    start_step = models.BigIntegerField(help_text="the first step trained on this set")
    dataset_versions = models.ManyToManyField(DatasetVersion, related_name="data_stages")
    checkpoint = models.ForeignKey(
        "checkpoints.Checkpoint", null=True, blank=True, on_delete=models.PROTECT, related_name="data_stages"
    )
    metadata = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = DataStageQuerySet.as_manager()

    class Meta:
        ordering = ["run", "start_step"]
        constraints = [
            models.UniqueConstraint(fields=["run", "start_step"], name="datastage_unique_run_start_step"),
            models.CheckConstraint(condition=Q(start_step__gte=0), name="datastage_start_step_non_negative"),
        ]

    def __str__(self):
        return f"{self.run} from step {self.start_step}"


class RunTagQuerySet(VisibleQuerySet):
    project_path = "run__project"


class RunTag(models.Model):
    """A free-form ``key → value`` label of a Run, set through the MLflow API (docs/design/interfaces.md#mlflow).

    One value per ``(run, key)``, held by the database: setting a tag again
    replaces its value (MLflow's ``set_tag``).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tags")
    key = models.CharField(max_length=250)
    value = models.TextField(blank=True)

    objects = RunTagQuerySet.as_manager()

    class Meta:
        ordering = ["run", "key"]
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="runtag_unique_run_key")]

    def __str__(self):
        return f"{self.key}={self.value}"


class ParameterChangeQuerySet(VisibleQuerySet):
    project_path = "run__project"


class ParameterChange(models.Model):
    """A parameter whose value a resume changed with ``allow_param_change`` (docs/design/runs.md#resume-modes), or a
    continue changed from its source Run's (docs/design/resume.md#declared-changes); append-only.

    The Run's ``parameters`` hold the current values; these rows keep what
    they were before, so the Run page can show every change.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="parameter_changes")
    key = models.CharField(max_length=250)
    old_value = models.JSONField(null=True, blank=True)
    new_value = models.JSONField(null=True, blank=True)
    lease_token = models.BigIntegerField(help_text="fencing token of the resume that made the change")
    changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    changed_at = models.DateTimeField(auto_now_add=True)

    objects = ParameterChangeQuerySet.as_manager()

    class Meta:
        ordering = ["run", "changed_at", "id"]

    def __str__(self):
        return f"{self.key}: {self.old_value!r} → {self.new_value!r}"
