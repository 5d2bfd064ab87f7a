"""Helpers shared by the Job services: creating a Job's Run and Job with its dispatch, revoke on commit, ending a
Run."""

import copy
import logging
import uuid
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from jobs.models import Job, JobStatus, Queue, RunToken
from mado import outbox
from mado.audit import audit_record
from mado.errors import ValidationFailed
from runs.liveness import run_ended_effects
from runs.models import FINAL_STATES as RUN_FINAL_STATES
from runs.models import CodeVersion, Run, RunStatus

logger = logging.getLogger("jobs")

RUN_JOB_TASK = "worker.tasks.run_job"

# Job outcome → Run status (docs/design/worker.md#subprocess: the exit code decides both, consistently).
RUN_STATUS_FOR_JOB = {
    JobStatus.SUCCEEDED: RunStatus.FINISHED,
    JobStatus.FAILED: RunStatus.FAILED,
    JobStatus.ABORTED: RunStatus.ABORTED,
    JobStatus.PREEMPTED: RunStatus.PREEMPTED,
}
MAX_RETRIES_LIMIT = 10
NPROC_PER_NODE_LIMIT = 256


def clean_nproc_per_node(value, default: int = 1) -> int:
    """Processes per node of a distributed Job (docs/design/worker.md#distributed): None → ``default``; else an int from
    1 to 256.

    Raises ``ValidationFailed`` naming ``nproc_per_node`` otherwise.
    """
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= NPROC_PER_NODE_LIMIT:
        raise ValidationFailed(
            f"nproc_per_node must be an integer from 1 to {NPROC_PER_NODE_LIMIT} (processes started by torchrun)",
            field="nproc_per_node",
        )
    return value


def clean_max_retries(value, field: str = "max_retries") -> int:
    """``value`` when it is an int from 0 to 10 (``max_retries``, ``max_restarts``); ``ValidationFailed`` naming
    ``field`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RETRIES_LIMIT:
        raise ValidationFailed(
            _("%(field)s must be an integer from 0 to %(max)s") % {"field": field, "max": MAX_RETRIES_LIMIT},
            field=field,
        )
    return value


def require_enabled(queue: Queue) -> Queue:
    if not queue.enabled:
        raise ValidationFailed(
            _("queue '%(queue)s' is disabled and accepts no new Jobs") % {"queue": queue.name}, field="queue"
        )
    return queue


def new_job_run(
    *,
    source: Run,
    created_by,
    name: str,
    code_version: CodeVersion,
    parent: Run | None = None,
    source_checkpoint=None,
    parameters: dict | None = None,
    dataset_versions: list | None = None,
) -> Run:
    """A pending Run with ``source``'s project, kind, parameters and input dataset versions (copied,
    docs/design/resume.md#lineage, #retry).

    A continue (docs/design/resume.md#continue, #continue-lineage) passes its own ``parameters`` and
    ``dataset_versions`` (already validated) instead of the copies. ``source`` itself is only read
    (docs/design/house.md#immutable).
    """
    run = Run.objects.create(
        project_id=source.project_id,
        name=name[:200],
        kind=source.kind,
        status=RunStatus.PENDING,
        created_by=created_by,
        parameters=copy.deepcopy(source.parameters if parameters is None else parameters),
        code_version=code_version,
        parent=parent,
        source_checkpoint=source_checkpoint,
    )
    if dataset_versions is None:
        dataset_versions = list(source.input_dataset_versions.values_list("pk", flat=True))
    run.input_dataset_versions.set(dataset_versions)
    return run


def create_job(
    *,
    run: Run,
    code_version: CodeVersion,
    queue: Queue,
    kind: str,
    created_by,
    max_retries: int,
    attempt: int = 1,
    retry_of: Job | None = None,
    resumed_from: Run | None = None,
    request_key: str | None = None,
    nproc_per_node: int = 1,
    max_restarts: int = 0,
    restart_of: Job | None = None,
    restarts: int = 0,
    delay_s: float = 0,
) -> Job:
    """Insert the queued Job of ``run`` with a fresh Celery task id and its dispatch (sent to its queue on commit).

    The message ``worker.tasks.run_job(job.id)`` goes through the outbox
    (``mado.outbox.dispatch_create``): the task is named, not imported, the
    Job's ``celery_task_id`` is the one the message carries (``nproc_per_node``
    already checked by ``clean_nproc_per_node``), and a broker
    that is down leaves the Job ``queued`` "waiting for the queue" until beat
    sends it (never ``failed`` because of the broker, docs/design/worker.md#subprocess).
    ``restart_of``: the preempted Job this one restarts automatically (``restarts`` counts the chain: its + 1; a retry
    passes its failed Job's, so retries and restarts together stay within both budgets);
    ``delay_s``: seconds before a worker starts it (the restart's backoff).
    """
    job = Job.objects.create(
        run=run,
        code_version=code_version,
        queue=queue,
        kind=kind,
        status=JobStatus.QUEUED,
        created_by=created_by,
        max_retries=max_retries,
        attempt=attempt,
        retry_of=retry_of,
        resumed_from=resumed_from,
        celery_task_id=str(uuid.uuid4()),
        request_key=request_key,
        nproc_per_node=nproc_per_node,
        max_restarts=max_restarts,
        restart_of=restart_of,
        restarts=restarts if restart_of is None else restart_of.restarts + 1,
    )
    outbox.dispatch_create(
        task=RUN_JOB_TASK, args=[job.pk], queue=queue.name, task_id=job.celery_task_id, delay_s=delay_s
    )
    Run.objects.filter(pk=run.pk).update(ran_as_job=True)  # a fact runs reads (docs/design/house.md#arrows)
    run.ran_as_job = True
    _audit_job_created(job, run, resumed_from)
    return job


JOB_CREATED_ACTIONS = {"new": "job.launch", "resume": "run.resume", "continue": "run.continue", "retry": "job.retry"}


def _audit_job_created(job: Job, run: Run, resumed_from: Run | None) -> None:
    """One audit record per new Job (docs/api.md#audit); an automatic retry or restart is the system's doing, not its
    user's."""
    changes = {"kind": [None, job.kind], "run": [None, run.pk]}
    if resumed_from is not None:
        changes["resumed_from"] = [None, resumed_from.pk]
    if job.restart_of_id is not None:
        changes["restart_of"] = [None, job.restart_of_id]
    automatic = job.kind == "retry" or job.restart_of_id is not None
    audit_record(
        actor=None if automatic else job.created_by,
        action="job.restart" if job.restart_of_id else JOB_CREATED_ACTIONS[job.kind],
        obj=job,
        project_id=run.project_id,
        changes=changes,
    )


def record_job_alive(*, run_id: int, now) -> None:
    """Write onto the Run that its Job's worker vouches for it until ``now`` + ``MADO_JOB_HEARTBEAT_TIMEOUT`` s.

    The crash reaper spares a silent Run while this lies ahead
    (``runs.liveness``); a Run whose Job already ended is left as it is.
    """
    alive_until = now + timedelta(seconds=settings.MADO_JOB_HEARTBEAT_TIMEOUT)
    Run.objects.filter(pk=run_id, job_ended=False).update(job_alive_until=alive_until)


def record_job_ended(*, run_id: int) -> None:
    """Write onto the Run that its Job reached a final state: it takes no more data stages, nobody vouches for it."""
    Run.objects.filter(pk=run_id).update(job_ended=True, job_alive_until=None)


def revoke_on_commit(task_id: str) -> None:
    """Ask the workers to drop task ``task_id`` once the current transaction commits (best effort: the row decides)."""
    if not task_id:
        return

    def send():
        try:  # bounded like every send from a request: kombu retries a revoke on a hung broker without end
            outbox.broker_call(lambda: current_app.control.revoke(task_id))
        except Exception:  # noqa: BLE001 - a missed revoke is harmless: job_claim refuses a final Job
            logger.warning("could not revoke task %s", task_id, exc_info=True)

    transaction.on_commit(send)


def end_run(*, run_id: int, job_status: str, now=None) -> None:
    """Give the Job's Run the status matching ``job_status`` (docs/design/worker.md#subprocess), inside the caller's
    transaction.

    A Run not yet ended also gets ``ended_at``. A Run the SDK already ended
    otherwise takes the Job's outcome (the exit code decides), except that a
    failed Run that was preempting or preempted stays ``preempted`` (docs/design/runs.md#states).
    The Run's row is locked first (a concurrent ``run_set_status`` waits); when
    its status changed here, ``runs.liveness.run_ended_effects`` follows
    (MLflow checkpoint files become usable, docs/design/checkpoints.md#mlflow-checkpoints; its sweep trial is told,
    docs/design/sweeps.md#requeue).
    """
    before = Run.objects.select_for_update().filter(pk=run_id).values_list("status", flat=True).first()
    record_job_ended(run_id=run_id)
    _set_final_status(run_id=run_id, target=RUN_STATUS_FOR_JOB[job_status], now=now or timezone.now())
    run = Run.objects.get(pk=run_id)
    if run.status != before:
        # A Run the SDK or the reaper already ended had these effects then (run_set_status, runs_reap_crashed).
        run_ended_effects(run=run)


def _set_final_status(*, run_id: int, target: str, now) -> None:
    if target == RunStatus.FAILED:
        Run.objects.filter(pk=run_id, status=RunStatus.PREEMPTING).update(status=RunStatus.PREEMPTED, ended_at=now)
        Run.objects.filter(pk=run_id, status=RunStatus.PREEMPTED, ended_at__isnull=True).update(ended_at=now)
        if Run.objects.filter(pk=run_id, status=RunStatus.PREEMPTED).exists():
            return
    Run.objects.filter(pk=run_id).exclude(status__in=RUN_FINAL_STATES).update(status=target, ended_at=now)
    Run.objects.filter(pk=run_id).exclude(status=target).update(status=target)


def revoke_run_tokens(*, run_id: int, now=None) -> None:
    """Revoke the Run's API tokens: the Job's code no longer acts on the Run once the Job ended."""
    RunToken.objects.filter(run_id=run_id, revoked_at__isnull=True).update(revoked_at=now or timezone.now())


def clean_request_key(request_key) -> str | None:
    """An Idempotency-Key / form token: None, or 1..100 characters (else ``ValidationFailed``)."""
    if request_key in (None, ""):
        return None
    if not isinstance(request_key, str) or len(request_key) > 100:
        raise ValidationFailed("the request key must be at most 100 characters", field="request_key")
    return request_key


def once_per_request(*, actor, request_key: str | None, create) -> Job:
    """Run ``create()`` (which passes ``request_key`` to ``create_job``) at most once per (actor, key).

    A repeated submission returns the Job of the first one. Two concurrent
    ones race on the database constraint ``job_unique_creator_request_key``:
    the loser's transaction (its Run included) rolls back and it returns the
    winner's Job (docs/design/house.md#idempotent). Without a key, ``create()`` runs as is.
    """
    request_key = clean_request_key(request_key)
    if request_key is None:
        return create(None)
    existing = Job.objects.filter(created_by=actor, request_key=request_key).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            return create(request_key)
    except IntegrityError:
        existing = Job.objects.filter(created_by=actor, request_key=request_key).first()
        if existing is None:
            raise
        return existing
