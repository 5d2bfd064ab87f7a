"""Automatic restarts of a preempted Job (docs/design/resume.md#restarts).

A Job launched with ``max_restarts`` N that ends ``preempted`` (the worker
stopped it, or its code marked its Run preempting) or whose worker is lost
(the reaper) is resumed by itself, at most N times along its chain: from its
Run's latest complete checkpoint (``jobs.selectors.latest_resume_checkpoint``)
as a new Run and Job of kind ``resume``, through the resume protocol
(``jobs.services.resume``: the same conditions, the same lineage, the
verdict of a resumed Run), on the same queue, after a backoff that doubles
each time. A Job preempted before its first checkpoint starts again from
the start only when the operator allows it (``MADO_JOB_RESTART_FROM_START``).
"""

import re

from django.conf import settings
from django.utils.translation import gettext as _

from checkpoints.models import Checkpoint
from jobs import selectors
from jobs.models import Job, JobKind, JobStatus
from jobs.services._common import create_job, new_job_run, require_enabled
from jobs.services.resume import _already_resuming, _require_may_manage, _resume
from mado.errors import Conflict

RESTARTED_SUFFIX = re.compile(r"( · restarted)+$")
RESTARTABLE = (JobStatus.PREEMPTED, JobStatus.FAILED)  # failed: only when the reaper found its worker lost


def restart_delay_s(restarts: int) -> float:
    """Seconds before restart number ``restarts + 1`` starts: ``MADO_JOB_RESTART_BACKOFF_S`` doubled per earlier
    restart, at most ``MADO_JOB_RESTART_BACKOFF_MAX_S``."""
    return min(settings.MADO_JOB_RESTART_BACKOFF_S * 2**restarts, settings.MADO_JOB_RESTART_BACKOFF_MAX_S)


def job_restart(*, job: Job) -> Job:
    """The automatic restart of ``job`` (a new queued Job, sent after ``restart_delay_s``); call inside
    ``transaction.atomic`` (``job_finish`` and the reaper do, in the transaction that ended ``job``).

    Idempotent: a Job has at most one restart (database constraint), returned
    when it exists. ``Conflict`` when ``job`` did not end preempted or failed,
    used its ``max_restarts``, has no complete checkpoint (and starting from
    the start is not allowed), or a resume condition fails (its queue was
    disabled, its creator may no longer run it: the message says which).
    """
    row = Job.objects.select_for_update(of=("self",)).select_related("run", "queue", "code_version").get(pk=job.pk)
    existing = Job.objects.filter(restart_of=row).first()
    if existing is not None:
        return existing
    if row.status not in RESTARTABLE:
        raise Conflict(
            _("job %(id)s is %(status)s: only a preempted Job is restarted") % {"id": row.pk, "status": row.status},
            field="job",
        )
    if row.restarts >= row.max_restarts:
        raise Conflict(
            _("job %(id)s used its %(count)s automatic restarts") % {"id": row.pk, "count": row.max_restarts},
            field="job",
        )
    delay_s = restart_delay_s(row.restarts)
    checkpoint = selectors.latest_resume_checkpoint(run=row.run)
    if checkpoint is None:
        return _restart_from_start(row, delay_s)
    return _resume(
        actor=row.created_by,
        source_run=row.run,
        checkpoint=Checkpoint.objects.select_related("run").get(pk=checkpoint.pk),
        code_version=None,
        queue=row.queue,
        nproc_per_node=row.nproc_per_node,
        restart_of=row,
        attempt=row.attempt,
        delay_s=delay_s,
    )


def _restart_from_start(row: Job, delay_s: float) -> Job:
    if not settings.MADO_JOB_RESTART_FROM_START:
        raise Conflict(
            _("it has no complete checkpoint to resume from (MADO_JOB_RESTART_FROM_START is off)"), field="job"
        )
    source = row.run
    _require_may_manage(row.created_by, source)
    conflict = _already_resuming(source)
    if conflict:
        raise conflict
    return create_job(
        run=new_job_run(
            source=source,
            created_by=row.created_by,
            name=f"{RESTARTED_SUFFIX.sub('', source.name) or source.external_id} · restarted",
            code_version=row.code_version,
        ),
        code_version=row.code_version,
        queue=require_enabled(row.queue),
        kind=JobKind.NEW,
        created_by=row.created_by,
        max_retries=row.max_retries,
        nproc_per_node=row.nproc_per_node,
        max_restarts=row.max_restarts,
        restart_of=row,
        attempt=row.attempt,
        delay_s=delay_s,
    )
