"""Starting a Run by its id: create, attach or resume under one writer lease
(docs/design/runs.md#resume-modes, #one-writer-process).

``POST runs/`` with an ``external_id`` (the run id) and a ``resume`` mode is
decided by the matrix below, keyed on ``(project, external_id)``. A Run
"exists" for the matrix once it was started (any status but ``pending``); a
``pending`` Run (a Job's or a sweep trial's pre-created Run) is attached by
its creator instead (pending → running).

==========  =====================  ==========================  ==========================
resume      exists                 pending (never started)     absent
==========  =====================  ==========================  ==========================
must        resume (writers)       404 (never started)         404 "not found in project"
allow       resume (writers)       attach (creator only)       create
never/None  409 "already exists"   attach (creator only)       create
==========  =====================  ==========================  ==========================

"Writers" are the people the write rule names (docs/design/runs.md#write-rule).
Every start takes the Run's write lease: ``lease_token`` + 1 is the fencing
token the SDK sends with each write (``runs.lease``). A start that names its
writer ``host`` (the SDK does) promises heartbeats: ``heartbeat_at`` is set
now, so the Run is live (docs/design/runs.md#one-writer-process) and is reaped as crashed when the beats stop
(docs/design/runs.md#states). A start without ``host`` (curl, an older SDK) leaves ``heartbeat_at``
empty: such a Run is never reaped and never refused as live. Races: the Run row is
locked (``SELECT … FOR UPDATE``) and every change is a conditional UPDATE on
the lease token or status read under that lock; two creates of one id are
decided by the ``(project, external_id)`` unique constraint. So two
concurrent starts of one id never both win.
"""

import json
import re
from datetime import timedelta
from typing import NamedTuple

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from mado import policy
from mado.errors import Conflict, Forbidden, NotFound, RunLive, ValidationFailed
from runs import hooks, services
from runs.metric_batch import STEP_MAX
from runs.models import MetricSummary, ParameterChange, Project, Run, RunStatus
from runs.segments import segment_open

MUST, ALLOW, NEVER = "must", "allow", "never"
RESUME_MODES = (MUST, ALLOW, NEVER)
RESUME_ERROR = "resume must be one of must, allow, never; auto is resolved by the SDK"
RUN_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"
RUN_ID_ERROR = "external_id must be 1 to 128 characters from A-Z, a-z, 0-9, '_', '.' and '-'"
LIVE_STATES = (RunStatus.RUNNING, RunStatus.PREEMPTING)
_RUN_ID = re.compile(RUN_ID_PATTERN)
_PID_MAX = 2**31 - 1


class RunStarted(NamedTuple):
    """What ``run_start`` did: ``created`` (201) or attached / ``resumed`` (200); ``last_step`` on a resume."""

    run: Run
    created: bool
    resumed: bool
    last_step: int | None


class _IdTaken(Exception):
    """A concurrent start created the id between our read and our insert."""


def clean_run_id(external_id) -> str:
    """``external_id`` if it matches ``[A-Za-z0-9_.-]{1,128}``, else ``ValidationFailed`` naming ``external_id``."""
    if not isinstance(external_id, str) or not _RUN_ID.match(external_id):
        raise ValidationFailed(RUN_ID_ERROR, field="external_id")
    return external_id


def _clean_resume(resume) -> str | None:
    if resume is None or resume == "":
        return None
    if resume not in RESUME_MODES:
        raise ValidationFailed(RESUME_ERROR, field="resume")
    return resume


def _clean_writer(host, pid) -> tuple[str, int | None]:
    if not isinstance(host or "", str) or len(host or "") > 255:
        raise ValidationFailed("host must be a string of at most 255 characters", field="host")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid <= _PID_MAX):
        raise ValidationFailed("pid must be a process id (an integer >= 0)", field="pid")
    return host or "", pid


def run_start(
    *,
    actor,
    project: Project,
    external_id: str | None = None,
    resume: str | None = None,
    allow_param_change: bool = False,
    host: str = "",
    pid: int | None = None,
    **create_fields,
) -> RunStarted:
    """``POST runs/``: create, attach or resume Run ``external_id`` of ``project`` by the matrix above
    (docs/design/runs.md#resume-modes, #one-writer-process).

    ``resume``: ``"must"`` | ``"allow"`` | ``"never"`` | None (None: as
    never). ``host`` (≤ 255 characters) and ``pid`` name the writer process.
    ``create_fields`` are ``runs.services.run_create``'s (name, kind,
    parameters, input_dataset_version_ids, code_version_id, parent_id); on
    a resume only ``parameters`` is used (merged, see ``_merge_parameters``).
    Every start takes a new fencing token (``run.lease_token``) and sets the
    writer; ``heartbeat_at`` is set now only when ``host`` is given (the
    client heartbeats; see the module docstring); attach and resume send ``runs.hooks.run_started``
    (the sweeps app: the Run's trial becomes running).

    Raises ``Forbidden`` unless member or admin, and on a resume unless
    ``policy.why_cannot_resume_by_id`` allows it (a writer of the Run; any
    member when the Project opted in and the Run is not a Job's; docs/design/runs.md#write-rule);
    ``ValidationFailed`` naming
    ``external_id`` (not ``[A-Za-z0-9_.-]{1,128}``; ``must`` without an id),
    ``resume``, ``host``, ``pid`` or a create field; ``NotFound`` (``must``,
    no started Run of that id in ``project``: "run <id> not found in project
    <slug>"); ``Conflict`` (``never``/None on a started Run, another user's
    pending Run, a changed parameter without ``allow_param_change`` naming
    ``parameters.<key>``); ``RunLive`` (the Run's heartbeat is fresher than
    ``MMT_CRASH_TIMEOUT`` s: another process writes to it).
    """
    policy.require_role(actor, project, policy.MEMBER)
    resume = _clean_resume(resume)
    host, pid = _clean_writer(host, pid)
    if external_id in (None, ""):
        if resume == MUST:
            raise ValidationFailed("resume='must' needs the external_id of the run to resume", field="external_id")
        external_id = None
    else:
        external_id = clean_run_id(external_id)
    tries = 2
    while True:
        tries -= 1
        try:
            if external_id is None:
                return _create(actor, project, None, host, pid, create_fields)
            return _start(actor, project, external_id, resume, bool(allow_param_change), host, pid, create_fields)
        except _IdTaken:
            # Another process created the id just now: with allow, decide again (now a resume, RunLive while it
            # lives); a generated id that collided is simply drawn again.
            if not tries or (external_id is not None and resume != ALLOW):
                raise Conflict(
                    f"run {external_id} already exists in project {project.slug}", field="external_id"
                ) from None


@transaction.atomic
def _start(actor, project, external_id, resume, allow_param_change, host, pid, create_fields) -> RunStarted:
    run = (
        Run.objects.select_for_update()
        .select_related("project", "created_by")
        .filter(project=project, external_id=external_id)
        .first()
    )
    if run is None:
        if resume == MUST:
            raise NotFound(f"run {external_id} not found in project {project.slug}", field="external_id")
        return _create(actor, project, external_id, host, pid, create_fields)
    if run.status == RunStatus.PENDING:
        return _attach(actor, run, resume, host, pid, create_fields)
    if resume in (MUST, ALLOW):
        refusal = policy.why_cannot_resume_by_id(actor, run)
        if refusal:
            raise Forbidden(refusal, field="external_id")
        return _resume(actor, run, create_fields.get("parameters"), allow_param_change, host, pid)
    raise Conflict(
        f"run {external_id} already exists in project {project.slug}; pass resume='allow' to continue it",
        field="external_id",
    )


@transaction.atomic
def _create(actor, project, external_id, host, pid, create_fields) -> RunStarted:
    try:
        run = services.run_create(actor=actor, project=project, external_id=external_id, **create_fields)
    except Conflict as exc:
        if exc.field == "external_id":
            raise _IdTaken from None
        raise
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        lease_token=F("lease_token") + 1,
        writer_host=host,
        writer_pid=pid,
        writer_since=now,
        heartbeat_at=now if host else None,
    )
    run.refresh_from_db()
    return RunStarted(run, created=True, resumed=False, last_step=None)


def _attach(actor, run: Run, resume, host, pid, create_fields) -> RunStarted:
    if resume == MUST:
        raise NotFound(
            f"run {run.external_id} not found in project {run.project.slug}: it was created but never started "
            "(start it with resume='allow')",
            field="external_id",
        )
    if run.created_by_id != actor.pk:
        raise Conflict(
            f"run {run.external_id} in project {run.project.slug} was created by {run.created_by.username} "
            "and waits for its creator to start it",
            field="external_id",
        )
    attached = services.run_attach(
        actor=actor,
        project=run.project,
        external_id=run.external_id,
        host=host,
        pid=pid,
        name=create_fields.get("name") or "",
        parameters=create_fields.get("parameters"),
    )
    if attached is None:  # the row lock makes this unreachable on PostgreSQL; say so rather than guess
        raise Conflict(f"run {run.external_id} was started by another process meanwhile", field="external_id")
    hooks.run_started.send(sender=None, run=attached)
    return RunStarted(attached, created=False, resumed=False, last_step=None)


def _refuse_live(run: Run, now) -> None:
    """``RunLive`` when another process holds ``run``'s lease: live status and a heartbeat within the crash timeout."""
    if run.status not in LIVE_STATES or run.heartbeat_at is None:
        return
    age = (now - run.heartbeat_at).total_seconds()
    if run.heartbeat_at <= now - timedelta(seconds=settings.MMT_CRASH_TIMEOUT):
        return
    since = (run.writer_since or run.started_at or run.heartbeat_at).isoformat()
    raise RunLive(
        f"run {run.external_id} is live on {run.writer_host or 'an unknown host'} since {since} "
        f"(last heartbeat {max(int(age), 0)} s ago): stop that process (pid {run.writer_pid}), or resume once it is "
        f"marked crashed, {settings.MMT_CRASH_TIMEOUT} s after its last heartbeat",
        field="external_id",
    )


def _merge_parameters(run: Run, parameters, allow_change: bool) -> tuple[dict, list[tuple[str, object, object]]]:
    """The Run's parameters with ``parameters`` merged in, and the ``(key, old, new)`` values changed.

    New keys are added. A key whose value differs is refused with ``Conflict``
    naming ``parameters.<key>`` unless ``allow_change``.
    """
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, dict):
        raise ValidationFailed("parameters must be a JSON object", field="parameters")
    merged, changes = dict(run.parameters or {}), []
    for key in sorted(parameters):
        new = parameters[key]
        if key not in merged:
            merged[key] = new
        elif json.dumps(merged[key], sort_keys=True) != json.dumps(new, sort_keys=True):
            if not allow_change:
                raise Conflict(
                    f"parameter {key} is {json.dumps(merged[key])} in run {run.external_id}; "
                    f"pass allow_param_change=True to change it to {json.dumps(new)}",
                    field=f"parameters.{key}",
                )
            changes.append((key, merged[key], new))
            merged[key] = new
    return merged, changes


def run_last_step(*, run_id: int) -> int | None:
    """The last step Run ``run_id`` reached: its highest metric step, or its highest checkpoint step - 1.

    A checkpoint's step counts the steps completed (docs/design/checkpoints.md#a-checkpoint), so a Run
    resumed from checkpoint N continues at step N. None when the Run has no
    metric point and no checkpoint beyond step 0 (docs/design/runs.md#resume-modes). Reads one
    summary row per metric key, never the points: O(1) in the Run's size.
    """
    metric = MetricSummary.objects.filter(run_id=run_id).aggregate(last=Max("last_step"))["last"]
    checkpoint = Run.objects.filter(pk=run_id).aggregate(last=Max("checkpoints__step"))["last"]
    steps = [s for s in (metric, None if checkpoint is None else checkpoint - 1) if s is not None and s >= 0]
    return max(steps) if steps else None


def _resume(actor, run: Run, parameters, allow_change: bool, host, pid) -> RunStarted:
    """Resume ``run`` (row locked by the caller): refuse a live one, merge parameters, continue the steps, new lease."""
    now = timezone.now()
    _refuse_live(run, now)
    merged, changes = _merge_parameters(run, parameters, allow_change)
    last_step = run_last_step(run_id=run.pk)
    # The floor is the step after the last one, kept in a BIGINT: a Run that logged the largest step resumes at it.
    floor = run.step_floor if last_step is None else max(run.step_floor, min(last_step + 1, STEP_MAX))
    extra = {"started_at": now} if run.started_at is None else {}
    updated = Run.objects.filter(pk=run.pk, lease_token=run.lease_token, status=run.status).update(
        status=RunStatus.RUNNING,
        ended_at=None,
        lease_token=run.lease_token + 1,
        writer_host=host,
        writer_pid=pid,
        writer_since=now,
        heartbeat_at=now if host else None,
        resume_count=F("resume_count") + 1,
        step_floor=floor,
        parameters=merged,
        **extra,
    )
    if not updated:  # another start won between our read and this UPDATE (no row lock on SQLite)
        raise RunLive(f"run {run.external_id} was started by another process just now", field="external_id")
    ParameterChange.objects.bulk_create(
        ParameterChange(
            run=run, key=key, old_value=old, new_value=new, lease_token=run.lease_token + 1, changed_by=actor
        )
        for key, old, new in changes
    )
    run.refresh_from_db()
    segment_open(run=run)  # docs/design/resume.md#same-run-parity
    hooks.run_started.send(sender=None, run=run)
    return RunStarted(run, created=False, resumed=True, last_step=last_step)
