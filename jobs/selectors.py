"""Reads of Jobs, Queues and Run logs for pages and the API (docs/design/house.md#where-logic-goes;
docs/design/resume.md; docs/design/worker.md).

Every lookup is scoped to the user's Projects: another Project's Job is
indistinguishable from a missing one (``NotFound``, 404). The "latest
checkpoint" rule (docs/design/resume.md#latest-checkpoint) lives in ``latest_resume_checkpoint`` only.
"""

from django.conf import settings
from django.db.models import Exists, OuterRef, QuerySet

from checkpoints.models import Checkpoint, CheckpointState
from jobs.models import ACTIVE_STATES, Job, JobKind, Queue, RunLogChunk
from mado import policy
from mado.db import id_or_none
from mado.errors import NotFound, ValidationFailed
from mado.models import Dispatch
from runs.models import Project, Run

LOG_PAGE_MAX = 1000


def _with_relations(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """With the relations pages and API show (the Run's parity verdict, restore report and parameter changes too, the
    Job's automatic restart), and
    ``dispatch_unsent`` (``Job.waiting_for_queue``, docs/design/worker.md#subprocess)."""
    unsent = Dispatch.objects.filter(task_id=OuterRef("celery_task_id"), sent_at__isnull=True, done_at__isnull=True)
    return (
        jobs.select_related(
            "run__project",
            "run__created_by",
            "run__source_checkpoint",
            "run__parity",
            "run__restore_report",
            "code_version__code",
            "queue",
            "created_by",
            "restart",
        )
        .prefetch_related("run__parameter_changes", "run__data_stages")
        .annotate(dispatch_unsent=Exists(unsent))
    )


def job_list(*, user, project: Project | None = None, status: str | None = None) -> QuerySet[Job]:
    """Jobs of the user's Projects (any role), newest first, optionally of one ``project`` and ``status``."""
    jobs = Job.objects.visible_to(user)
    if project is not None:
        jobs = jobs.filter(run__project=project)
    if status:
        jobs = jobs.filter(status=status)
    return _with_relations(jobs).order_by("-created_at", "-id")


def job_get_for_user(*, user, job_id) -> Job:
    """The Job ``job_id`` in one of the user's Projects; else ``NotFound`` (404, docs/design/house.md#one-policy)."""
    job = _with_relations(Job.objects.visible_to(user)).filter(pk=id_or_none(job_id)).first()
    if job is None:
        raise NotFound(f"job {job_id!r} not found", field="job")
    return job


def job_for_run(*, run: Run) -> Job | None:
    """The Job that executes ``run``, or None (a Run created by the SDK alone)."""
    return Job.objects.filter(run=run).select_related("queue", "code_version__code").first()


def queue_list(*, include_disabled: bool = False) -> QuerySet[Queue]:
    """The execution targets by name; only enabled ones unless ``include_disabled``."""
    queues = Queue.objects.all()
    if not include_disabled:
        queues = queues.filter(enabled=True)
    return queues.order_by("name")


def default_queue_name() -> str:
    """The queue a Job goes to when none is named (``MADO_DEFAULT_QUEUE``, default ``cpu``)."""
    return settings.CELERY_TASK_DEFAULT_QUEUE


def continue_queue_name(*, source_job: Job | None) -> str:
    """Where a Job continuing from a checkpoint goes when none is named: the source Run's Job's queue, else
    ``default_queue_name()`` (docs/design/resume.md#continue; the web form and the API agree)."""
    return source_job.queue.name if source_job else default_queue_name()


def queue_get(*, name: str) -> Queue:
    """The enabled Queue called ``name``; else ``ValidationFailed`` naming ``queue`` and the choices."""
    queue = Queue.objects.filter(name=name, enabled=True).first()
    if queue is None:
        choices = ", ".join(queue_list().values_list("name", flat=True)) or "none configured"
        raise ValidationFailed(f"unknown or disabled queue {name!r}; one of: {choices}", field="queue")
    return queue


def latest_resume_checkpoint(*, run: Run) -> Checkpoint | None:
    """The checkpoint "Resume from latest" uses for ``run`` (docs/design/resume.md#latest-checkpoint), or None.

    The Run's ``complete`` checkpoint with the highest step; if it has none
    and is itself a resumed Run, its own source checkpoint (when still
    complete); else None. Advisory: the resume service locks and checks it
    again (``checkpoint_lock_for_use``).
    """
    own = Checkpoint.objects.filter(run=run, state=CheckpointState.COMPLETE).order_by("-step").first()
    if own is not None:
        return own
    if run.source_checkpoint_id:
        return Checkpoint.objects.filter(pk=run.source_checkpoint_id, state=CheckpointState.COMPLETE).first()
    return None


def resume_refusal(*, user=None, run: Run, need_checkpoint: bool = True) -> str | None:
    """``mado.policy.why_cannot_resume`` (or, with no ``user``, ``why_run_not_resumable``) for ``run`` with its Job
    and the latest-checkpoint rule's checkpoint read here; ``need_checkpoint`` False for a button that names its
    checkpoint (docs/design/resume.md)."""
    job = job_for_run(run=run)
    has_checkpoint = latest_resume_checkpoint(run=run) is not None if need_checkpoint else None
    if user is None:
        return policy.why_run_not_resumable(run, job=job, has_checkpoint=has_checkpoint)
    return policy.why_cannot_resume(user, run, job=job, has_checkpoint=has_checkpoint)


def run_log_tail(*, run: Run, after_seq: int = 0, limit: int = LOG_PAGE_MAX) -> list[RunLogChunk]:
    """The Run's log chunks with ``seq > after_seq``, oldest first, at most ``limit`` (≤ 1000)."""
    limit = max(1, min(limit, LOG_PAGE_MAX))
    return list(RunLogChunk.objects.filter(run=run, seq__gt=after_seq).order_by("seq")[:limit])


LOG_TAIL_CHUNKS = 300


def run_log_tail_last(*, run: Run, max_chunks: int = LOG_TAIL_CHUNKS) -> tuple[list, int]:
    """The last ``max_chunks`` chunks of the Run's log (what its Job's code printed, docs/design/worker.md#subprocess),
    oldest first, and how many earlier chunks were left out. The Logs tab and the Job page show this tail."""
    chunks = list(RunLogChunk.objects.filter(run=run).order_by("-seq")[:max_chunks])
    chunks.reverse()
    hidden = chunks[0].seq - 1 if chunks else 0
    return chunks, hidden


def active_resume_job_ids(*, run_ids) -> dict[int, int]:
    """``{source run id: id of its queued or running resume Job}`` for ``run_ids`` (at most one each,
    docs/design/resume.md#who-may-resume).

    The Jobs pages show "already queued or running" with a link in place of
    "Resume from latest checkpoint" for these Runs; the service refuses a
    second resume anyway (database constraint).
    """
    jobs = Job.objects.filter(resumed_from_id__in=list(run_ids), kind=JobKind.RESUME, status__in=ACTIVE_STATES)
    return dict(jobs.values_list("resumed_from_id", "pk"))
