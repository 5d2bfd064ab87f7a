"""Launching a Job and its automatic retries from scratch (docs/design/resume.md#retry;
docs/design/worker.md#subprocess)."""

from django.db import IntegrityError, transaction
from django.utils.translation import gettext as _

from jobs.models import Job, JobKind, JobStatus, Queue
from jobs.services._common import (
    clean_max_retries,
    clean_nproc_per_node,
    create_job,
    new_job_run,
    once_per_request,
    require_enabled,
)
from mado import policy
from mado.errors import Conflict
from runs.models import CodeVersion, RunKind, RunStatus
from runs.services import run_create


@transaction.atomic
def job_launch(
    *,
    actor,
    code_version: CodeVersion,
    queue: Queue,
    parameters: dict | None,
    dataset_version_ids: list[int] | None,
    name: str = "",
    kind_of_run: str = RunKind.TRAINING,
    max_retries: int = 0,
    request_key: str | None = None,
    nproc_per_node: int | None = None,
    max_restarts: int | None = None,
) -> Job:
    """Create a pending Run and its queued Job (kind ``new``) running ``code_version`` on ``queue``; enqueue on commit.

    The Run lives in the Code's Project; member or admin only (viewer →
    ``Forbidden``). ``parameters`` is a JSON object and ``dataset_version_ids``
    ids of the Project's dataset versions (else ``ValidationFailed`` naming
    ``parameters`` / ``input_dataset_version_ids``); ``kind_of_run`` a Run
    kind; ``max_retries`` 0..10 automatic fresh attempts after a failure,
    never from a checkpoint (docs/design/resume.md#retry); a disabled ``queue`` → ``ValidationFailed``
    naming ``queue``. ``worker.tasks.run_job(job.id)`` is sent to the queue
    named ``queue.name`` once the transaction commits. ``request_key`` (the
    form's token or the API's ``Idempotency-Key``): the same key again by the
    same user returns the first Job instead of launching a second (docs/design/house.md#idempotent).
    ``nproc_per_node`` (1..256, None: 1): above 1 the worker starts the code
    under torchrun with that many processes (docs/design/worker.md#distributed; else ``ValidationFailed``).
    ``max_restarts`` (0..10, None: the Project's ``job_max_restarts``): automatic resumes from the latest
    checkpoint after a preemption or a lost worker (docs/design/resume.md#restarts).
    """
    project = code_version.code.project
    policy.require_role(actor, project, policy.MEMBER)
    require_enabled(queue)
    max_retries = clean_max_retries(max_retries)
    max_restarts = project.job_max_restarts if max_restarts is None else clean_max_retries(max_restarts, "max_restarts")
    nproc_per_node = clean_nproc_per_node(nproc_per_node)

    def create(key: str | None) -> Job:
        run = run_create(
            actor=actor,
            project=project,
            name=name,
            kind=kind_of_run,
            parameters=parameters,
            input_dataset_version_ids=dataset_version_ids,
            code_version_id=code_version.pk,
            status=RunStatus.PENDING,
        )
        return create_job(
            run=run,
            code_version=code_version,
            queue=queue,
            kind=JobKind.NEW,
            created_by=actor,
            max_retries=max_retries,
            request_key=key,
            nproc_per_node=nproc_per_node,
            max_restarts=max_restarts,
        )

    return once_per_request(actor=actor, request_key=request_key, create=create)


@transaction.atomic
def job_retry_from_scratch(*, job: Job) -> Job:
    """The next attempt of a failed ``job``: a new Run and Job (kind ``retry``) that start the code from scratch
    (docs/design/resume.md#retry).

    Automatic (``job_finish`` calls it while attempts are left): the new Run
    copies the failed Run's kind, parameters and input dataset versions,
    runs the same code version on the same queue, and has no parent and no
    source checkpoint, so the worker never sets ``MMT_RESUME_*``; it keeps
    the failed Job's ``nproc_per_node``.
    ``attempt`` is the failed Job's + 1, ``retry_of`` the failed Job.
    Idempotent: a Job has at most one retry (database constraint), which is
    returned when it exists. ``Conflict`` unless ``job`` failed with attempts
    left (``attempt <= max_retries``) on an enabled queue.
    """
    row = Job.objects.select_for_update(of=("self",)).select_related("run", "queue", "code_version").get(pk=job.pk)
    existing = Job.objects.filter(retry_of=row).first()
    if existing is not None:
        return existing
    if row.status != JobStatus.FAILED:
        raise Conflict(
            _("job %(id)s is %(status)s: only a failed Job is retried") % {"id": row.pk, "status": row.status},
            field="job",
        )
    if row.attempt > row.max_retries:
        raise Conflict(
            _("job %(id)s used its %(count)s automatic retries") % {"id": row.pk, "count": row.max_retries}, field="job"
        )
    if not row.queue.enabled:
        raise Conflict(
            _("queue '%(queue)s' is disabled: job %(id)s is not retried") % {"queue": row.queue.name, "id": row.pk},
            field="queue",
        )
    source = row.run
    name = f"{source.name or source.external_id} · attempt {row.attempt + 1}"
    try:
        with transaction.atomic():
            run = new_job_run(source=source, created_by=row.created_by, name=name, code_version=row.code_version)
            return create_job(
                run=run,
                code_version=row.code_version,
                queue=row.queue,
                kind=JobKind.RETRY,
                created_by=row.created_by,
                max_retries=row.max_retries,
                attempt=row.attempt + 1,
                retry_of=row,
                nproc_per_node=row.nproc_per_node,
                max_restarts=row.max_restarts,
                restarts=row.restarts,
            )
    except IntegrityError:
        existing = Job.objects.filter(retry_of=row).first()
        if existing is None:
            raise
        return existing
