"""Resuming a stopped Job as a new Run (docs/design/resume.md).

One protocol for both buttons: check who asks (creator or Project admin,
``mado.policy``), lock the source Run's Job row (two clicks serialize on it),
check the source's state and the conditions (docs/design/resume.md#conditions), lock the checkpoint with
``checkpoint_lock_for_use`` (so it cannot be deleted before this commits, docs/design/checkpoints.md#deletion),
then create the Run (parent + source checkpoint, copied inputs) and its Job.
The database's conditional unique constraint allows one active resume per
source Run whatever happens above it. The source Run is only read (docs/design/resume.md#lineage).
"""

import re

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils.translation import gettext as _

from checkpoints.models import Checkpoint
from checkpoints.services import checkpoint_lock_for_use
from jobs import selectors
from jobs.models import ACTIVE_STATES, Job, JobKind, Queue
from jobs.services._common import clean_nproc_per_node, create_job, new_job_run, require_enabled
from mado import policy
from mado.errors import Conflict, Forbidden, NotFound, ValidationFailed
from runs.models import CodeVersion, Run

RESUMED_SUFFIX = re.compile(r"( · resumed from step \d+)+$")


def _require_may_manage(actor, run: Run) -> None:
    reason = policy.why_cannot_manage_job(actor, run)
    if reason:
        raise Forbidden(reason, field="run")


def _already_resuming(source_run: Run) -> Conflict | None:
    """The Conflict naming the queued or running resume of ``source_run`` (by hand, or its automatic restart), if
    any."""
    resuming = Q(resumed_from=source_run, kind=JobKind.RESUME) | Q(restart_of__run=source_run)
    active = Job.objects.filter(resuming, status__in=ACTIVE_STATES).first()
    if active is None:
        return None
    return Conflict(
        _("Run %(run)s is already being resumed by Job %(job)s.") % {"run": source_run, "job": active.pk},
        field="run",
        extra={"job_id": active.pk},
    )


def _code_id_of(run: Run) -> int | None:
    if run.code_version_id:
        return CodeVersion.objects.filter(pk=run.code_version_id).values_list("code_id", flat=True).first()
    return None


def _check_conditions(*, source_run: Run, source_job: Job, checkpoint: Checkpoint, code_version: CodeVersion | None):
    """docs/design/resume.md#conditions: same Project (else NotFound), same kind, same Code (any version). Returns the
    code version to run."""
    checkpoint_run = checkpoint.run
    if checkpoint_run.project_id != source_run.project_id:
        raise NotFound(f"checkpoint {checkpoint.pk} not found", field="checkpoint")
    if checkpoint_run.kind != source_run.kind:
        raise Conflict(
            f"run kind mismatch: the checkpoint comes from a {checkpoint_run.kind} run, run {source_run.pk} is "
            f"{source_run.kind}",
            field="checkpoint",
        )
    code = source_job.code_version.code
    if checkpoint_run.pk != source_run.pk and _code_id_of(checkpoint_run) != code.pk:
        raise Conflict(
            f"code mismatch: the checkpoint comes from run {checkpoint_run.pk}, which did not run Code {code.name!r}",
            field="checkpoint",
        )
    if code_version is None:
        return source_job.code_version
    if code_version.code.project_id != source_run.project_id:
        raise NotFound(f"code version {code_version.pk} not found", field="code_version_id")
    if code_version.code_id != code.pk:
        raise ValidationFailed(
            f"code_version_id must be a version of Code {code.name!r} (the Code run {source_run.pk} ran)",
            field="code_version_id",
        )
    return code_version


def _resume(*, actor, source_run: Run, checkpoint: Checkpoint, code_version, queue, nproc_per_node, **restart) -> Job:
    """The shared protocol (module docstring); call inside ``transaction.atomic``. ``restart``: ``restart_of`` and
    ``delay_s`` of an automatic restart (``jobs.services.restart``)."""
    _require_may_manage(actor, source_run)
    source_job = (
        Job.objects.select_for_update(of=("self",))
        .select_related("code_version__code", "queue")
        .filter(run_id=source_run.pk)
        .first()
    )
    source_run = Run.objects.select_related("project").get(pk=source_run.pk)  # fresh, after the lock
    reason = selectors.resume_refusal(run=source_run, need_checkpoint=False)
    if reason:
        raise Conflict(reason, field="run")
    conflict = _already_resuming(source_run)
    if conflict:
        raise conflict
    code_version = _check_conditions(
        source_run=source_run, source_job=source_job, checkpoint=checkpoint, code_version=code_version
    )
    queue = require_enabled(queue or source_job.queue)
    nproc_per_node = clean_nproc_per_node(nproc_per_node, default=source_job.nproc_per_node)
    locked = checkpoint_lock_for_use(checkpoint_id=checkpoint.pk)
    # A resume of a resume names the first Run once: "a · resumed from step 40", not "a · … 20 · … 40".
    base = RESUMED_SUFFIX.sub("", source_run.name) or source_run.external_id
    name = f"{base} · resumed from step {locked.step}"
    try:
        with transaction.atomic():
            run = new_job_run(
                source=source_run,
                created_by=actor,
                name=name,
                code_version=code_version,
                parent=source_run,
                source_checkpoint=locked,
            )
            return create_job(
                run=run,
                code_version=code_version,
                queue=queue,
                kind=JobKind.RESUME,
                created_by=actor,
                max_retries=source_job.max_retries,
                resumed_from=source_run,
                nproc_per_node=nproc_per_node,
                max_restarts=source_job.max_restarts,
                **restart,
            )
    except IntegrityError:
        conflict = _already_resuming(source_run)
        if conflict is None:
            raise
        raise conflict from None


@transaction.atomic
def run_resume_from_checkpoint(
    *,
    actor,
    checkpoint: Checkpoint,
    code_version: CodeVersion | None = None,
    queue: Queue | None = None,
    source_run: Run | None = None,
    nproc_per_node: int | None = None,
) -> Job:
    """Resume a failed or aborted Job's Run from ``checkpoint`` as a new Run and Job (kind ``resume``;
    docs/design/resume.md).

    ``source_run`` is the Run to resume, by default the checkpoint's Run; it
    may be another Run of the same Project (e.g. a resumed Run resuming from
    its ancestor's checkpoint) of the same kind and Code. ``code_version``
    (default: the source Job's) must be a version of the same Code;
    ``queue`` (default: the source Job's) must be enabled.
    ``nproc_per_node`` (default: the source Job's; 1..256) may differ from
    the source's: a sharded checkpoint is resharded on load (docs/design/worker.md#distributed).

    The new Run records ``parent`` = the source Run and ``source_checkpoint``,
    inherits its kind, copies its parameters and input dataset versions, and
    is created by ``actor``; the source Run is never modified. The worker is
    sent the Job on commit.

    Raises ``Forbidden`` (viewer; a member who did not create the source Run
    — creator or Project admin only), ``NotFound`` (checkpoint or code
    version of another Project), ``Conflict`` (the source did not run as a
    Job, is still running, finished — use continue —, ended otherwise than
    failed/aborted, is not training/fine-tuning, kind or Code mismatch, the
    checkpoint is not ``complete``, or the source is already being resumed
    by an active Job: ``extra`` ``{"job_id"}``), ``ValidationFailed``
    (``code_version_id`` of another Code, disabled ``queue``, bad ``nproc_per_node``).
    """
    checkpoint = Checkpoint.objects.select_related("run").get(pk=checkpoint.pk)
    return _resume(
        actor=actor,
        source_run=source_run or checkpoint.run,
        checkpoint=checkpoint,
        code_version=code_version,
        queue=queue,
        nproc_per_node=nproc_per_node,
    )


@transaction.atomic
def job_resume_from_latest(
    *,
    actor,
    job: Job,
    code_version: CodeVersion | None = None,
    queue: Queue | None = None,
    nproc_per_node: int | None = None,
) -> Job:
    """Resume ``job``'s failed, aborted or preempted Run from its latest checkpoint
    (docs/design/resume.md#latest-checkpoint): the Jobs list's button.

    Latest = the Run's complete checkpoint with the highest step; if it has
    none and is itself a resumed Run, its own source checkpoint
    (``selectors.latest_resume_checkpoint``); else ``Conflict`` "no
    checkpoint". Everything else as ``run_resume_from_checkpoint`` with the
    Job's Run as the source.
    """
    source_run = Run.objects.select_related("project").get(pk=job.run_id)
    _require_may_manage(actor, source_run)
    reason = selectors.resume_refusal(run=source_run)
    if reason:
        raise Conflict(reason, field="run")
    checkpoint = selectors.latest_resume_checkpoint(run=source_run)
    checkpoint = Checkpoint.objects.select_related("run").get(pk=checkpoint.pk)
    return _resume(
        actor=actor,
        source_run=source_run,
        checkpoint=checkpoint,
        code_version=code_version,
        queue=queue,
        nproc_per_node=nproc_per_node,
    )
