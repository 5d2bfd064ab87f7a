"""Queues, Jobs, Run logs and Run tokens (docs/design/resume.md; docs/design/worker.md; docs/jobs.md).

The database holds the invariants that must survive races: one Job per Run,
at most one active resume per source Run (two clicks, two tabs or an API
retry create one Job), one automatic retry per failed Job, one active token
per Run, and the valid status / kind / runner values.
"""

import secrets

from django.conf import settings
from django.db import models
from django.db.models import Q

from runs.models import CodeVersion, Run, VisibleQuerySet


class Runner(models.TextChoices):
    SUBPROCESS = "subprocess", "subprocess"
    CONTAINER = "container", "container"


class Queue(models.Model):
    """An execution target: a Celery queue of the same ``name`` that workers consume
    (``celery -A config worker -Q <name>``).

    Configured by admins (Django admin; a data migration creates ``cpu``).
    ``image`` is the container image of a ``container`` runner.
    """

    name = models.SlugField(max_length=100, unique=True, help_text="the Celery queue name, e.g. gpu-a100")
    description = models.TextField(blank=True)
    runner = models.CharField(max_length=20, choices=Runner.choices, default=Runner.SUBPROCESS)
    image = models.CharField(max_length=500, blank=True, help_text="container image (container runner only)")
    enabled = models.BooleanField(default=True, help_text="disabled queues accept no new Jobs")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(runner__in=Runner.values), name="queue_runner_valid"),
            models.CheckConstraint(
                condition=Q(runner=Runner.SUBPROCESS) | ~Q(image=""), name="queue_container_has_image"
            ),
        ]

    def __str__(self):
        return self.name


class JobKind(models.TextChoices):
    NEW = "new", "new"
    RESUME = "resume", "resumed"
    CONTINUE = "continue", "continued"
    RETRY = "retry", "retry"


class JobStatus(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    ABORTED = "aborted", "aborted"
    PREEMPTED = "preempted", "preempted"


FINAL_STATES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.ABORTED, JobStatus.PREEMPTED})
ACTIVE_STATES = frozenset({JobStatus.QUEUED, JobStatus.RUNNING})


class JobQuerySet(VisibleQuerySet):
    project_path = "run__project"


class Job(models.Model):
    """A Run executed by a worker on a Queue. One Job per Run; a retry is a new Run and Job.

    ``resumed_from`` is the source Run of a resume or continue (its Run's
    ``parent``); ``retry_of`` the failed Job an automatic retry replaces
    (docs/design/resume.md#retry). ``attempt`` is 1-based. ``heartbeat_at`` is written by the worker
    while the code runs; a running Job whose heartbeat is older than
    ``MADO_JOB_HEARTBEAT_TIMEOUT`` is failed by the reaper.
    """

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="job")
    code_version = models.ForeignKey(CodeVersion, on_delete=models.PROTECT, related_name="jobs")
    queue = models.ForeignKey(Queue, on_delete=models.PROTECT, related_name="jobs")
    kind = models.CharField(max_length=10, choices=JobKind.choices, default=JobKind.NEW)
    status = models.CharField(max_length=10, choices=JobStatus.choices, default=JobStatus.QUEUED)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    max_retries = models.PositiveIntegerField(default=0, help_text="automatic fresh attempts after a failure")
    max_restarts = models.PositiveIntegerField(
        default=0, help_text="automatic resumes from the latest checkpoint after a preemption or a lost worker"
    )
    restart_of = models.OneToOneField(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="restart",
        help_text="the preempted Job this automatic restart resumes (one restart per Job)",
    )
    restarts = models.PositiveIntegerField(default=0, help_text="automatic restarts before this Job in its chain")
    attempt = models.PositiveIntegerField(default=1, help_text="1 for the first attempt")
    nproc_per_node = models.PositiveIntegerField(
        default=1, help_text="processes per node: above 1 the worker starts the code under torchrun"
    )
    nnodes = models.PositiveIntegerField(default=1, help_text="nodes for a multi-node runner; the Celery worker runs 1")
    retry_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="retries",
        help_text="the failed Job this automatic retry replaces",
    )
    resumed_from = models.ForeignKey(
        Run,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="resumed_jobs",
        help_text="the source Run of a resume or continue",
    )
    exit_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    celery_task_id = models.CharField(max_length=255, blank=True)
    request_key = models.CharField(
        max_length=100,
        null=True,
        blank=True,
        help_text="the submitting form's or API client's Idempotency-Key: a repeated submission returns this Job",
    )
    worker_host = models.CharField(max_length=255, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    abort_requested_at = models.DateTimeField(null=True, blank=True)
    log_bytes = models.BigIntegerField(default=0, help_text="bytes of log stored (UTF-8)")
    log_truncated = models.BooleanField(default=False, help_text="the log reached MADO_JOB_LOG_MAX_BYTES")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=JobStatus.values), name="job_status_valid"),
            models.CheckConstraint(condition=Q(kind__in=JobKind.values), name="job_kind_valid"),
            models.CheckConstraint(condition=Q(attempt__gte=1), name="job_attempt_positive"),
            models.CheckConstraint(condition=Q(nproc_per_node__gte=1), name="job_nproc_per_node_positive"),
            models.CheckConstraint(condition=Q(nnodes__gte=1), name="job_nnodes_positive"),
            models.CheckConstraint(
                condition=Q(kind__in=[JobKind.RESUME, JobKind.CONTINUE], resumed_from__isnull=False)
                | Q(kind__in=[JobKind.NEW, JobKind.RETRY], resumed_from__isnull=True),
                name="job_resumed_from_iff_resume_or_continue",
            ),
            models.CheckConstraint(
                condition=Q(kind=JobKind.RETRY, retry_of__isnull=False)
                | (~Q(kind=JobKind.RETRY) & Q(retry_of__isnull=True)),
                name="job_retry_of_iff_retry",
            ),
            models.CheckConstraint(
                condition=~Q(status__in=sorted(FINAL_STATES)) | Q(ended_at__isnull=False),
                name="job_final_has_ended_at",
            ),
            # A double-clicked Launch / Continue button or an API retry with the same key: one Job
            # (docs/design/house.md#idempotent).
            models.UniqueConstraint(
                fields=["created_by", "request_key"],
                condition=Q(request_key__isnull=False),
                name="job_unique_creator_request_key",
            ),
            # Two clicks, two tabs or an API retry: at most one active resume per source Run
            # (docs/design/house.md#idempotent).
            models.UniqueConstraint(
                fields=["resumed_from"],
                condition=Q(kind=JobKind.RESUME, status__in=[JobStatus.QUEUED, JobStatus.RUNNING]),
                name="job_one_active_resume_per_source_run",
            ),
            # job_finish may run twice for one failure (worker and reaper): one retry per failed Job.
            models.UniqueConstraint(
                fields=["retry_of"], condition=Q(retry_of__isnull=False), name="job_one_retry_per_job"
            ),
        ]
        indexes = [
            models.Index(fields=["status", "heartbeat_at"], name="job_status_heartbeat_idx"),
        ]

    def __str__(self):
        return f"Job {self.pk} ({self.kind}, {self.status})"

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATES

    @property
    def waiting_for_queue(self) -> bool:
        """Queued, and the broker has not taken its message yet (the selectors annotate ``dispatch_unsent``)."""
        return self.status == JobStatus.QUEUED and bool(getattr(self, "dispatch_unsent", False))

    @property
    def is_resumed(self) -> bool:
        """True for a resume Job (the Jobs list's "resumed" badge, docs/design/resume.md#from-a-checkpoint)."""
        return self.kind == JobKind.RESUME

    @property
    def duration_seconds(self) -> float | None:
        if not self.started_at:
            return None
        end = self.ended_at or self.heartbeat_at or self.started_at
        return max((end - self.started_at).total_seconds(), 0.0)


class RunLogChunk(models.Model):
    """A piece of the code's stdout+stderr, appended by the worker; ``seq`` counts 1, 2, … per Run
    (docs/design/worker.md#subprocess)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="log_chunks")
    seq = models.PositiveIntegerField()
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="runlogchunk_unique_run_seq")]

    def __str__(self):
        return f"{self.run_id}#{self.seq}"


def new_token_key() -> str:
    """40 random hex characters: the plain key Run tokens had before digests (named by migration 0001 only)."""
    return secrets.token_hex(20)


class RunToken(models.Model):
    """The API token a Job's code gets as ``MMT_API_TOKEN``: acts as ``user`` on ``run`` only (docs/jobs.md).

    Revoked when the Job ends. At most one unrevoked token per Run. The key is
    never stored (docs/api.md#tokens): ``prefix`` finds the row, ``digest`` checks
    it, and ``salt`` lets ``run_token_issue`` give the same key again to a retried
    worker (the key is an HMAC of the salt under the server's secret key, so a copy
    of the database alone yields no key). ``salt`` is empty for a token carried over
    from plain storage: its key cannot be given again.
    """

    salt = models.CharField(max_length=32, blank=True, default="")
    prefix = models.CharField(max_length=12, db_index=True)
    digest = models.CharField(max_length=64, unique=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tokens")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="run_tokens")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["run"], condition=Q(revoked_at__isnull=True), name="runtoken_one_active_per_run"
            ),
        ]

    def __str__(self):
        return f"token of run {self.run_id} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
