"""Is a Run's process still alive? Heartbeats, the crash reaper and what follows a Run's end
(docs/design/runs.md#states; docs/design/sweeps.md#requeue).

The SDK sends ``POST runs/{id}/heartbeat/`` every ``MMT_HEARTBEAT_INTERVAL``
seconds (``run_heartbeat``). Beat calls ``runs_reap_crashed`` every 60 s: a
running Run silent for ``MMT_CRASH_TIMEOUT`` seconds becomes ``crashed``, a
preempting one ``preempted``. A Run whose writer never sends heartbeats (the
MLflow client, a curl script) is judged by its last write of any kind
(``run_touch``, ``Run.last_write_at``): silent for the Project's
``silent_run_timeout`` (default ``MMT_SILENT_RUN_TIMEOUT``, 24 h) it becomes
``crashed`` too (docs/design/runs.md#liveness). The reason is kept in ``Run.ended_reason``. Both write under the Run's
row lock (or a conditional UPDATE on the status), so a heartbeat, a resume and the reaper never both win: a Run the
reaper ended answers a late heartbeat with ``RunEnded``, and only a resume (``POST runs/``) makes it run again.
"""

import logging
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Coalesce
from django.utils import timezone

from mado import policy
from mado.errors import Conflict, RunEnded
from runs import hooks
from runs.lease import lease_check, refuse_stale_token
from runs.models import FINAL_STATES, Project, Run, RunStatus

logger = logging.getLogger("runs")

LIVE_STATES = (RunStatus.RUNNING, RunStatus.PREEMPTING)
# What a silent Run becomes: a preempting one was told to stop, so its silence is the preemption.
REAPED_STATUS = {RunStatus.RUNNING: RunStatus.CRASHED, RunStatus.PREEMPTING: RunStatus.PREEMPTED}


def run_ended_effects(*, run: Run) -> None:
    """What follows ``run`` reaching a final state, inside the transaction that ended it
    (docs/design/checkpoints.md#mlflow-checkpoints; docs/design/sweeps.md#requeue).

    The ``runs.hooks.run_ended`` receivers run: the sweeps app tells the
    Run's sweep trial (a preempted one goes back to the queue), the MLflow
    API completes files logged under ``checkpoints/step-N/`` through it,
    and the jobs app ends a Job no worker claimed. Callers call it once per
    change of status.
    """
    hooks.run_ended.send(sender=None, run=run)


def _ended_message(external_id: str, status: str) -> str:
    """The ``RunEnded`` text for a Run in a final ``status``: how to continue it."""
    return f"run {external_id} ended as {status}; resume it (start_run(id={external_id!r}, resume='allow')) to continue"


@transaction.atomic
def run_heartbeat(*, actor, run: Run, fencing_token: int | None) -> Run:
    """Record that ``run``'s process is alive: ``heartbeat_at`` = now (docs/design/runs.md#states); the Run as stored.

    Only a writer of the Run (``policy.why_cannot_write_run``, docs/design/runs.md#write-rule; else ``Forbidden``).
    ``fencing_token`` (the ``Mado-Fencing-Token`` header, None: not fenced) is checked under the Run's row lock: a stale
    one raises ``LeaseLost``. Only a running or preempting Run beats (conditional UPDATE on those states); one in a
    final state raises ``RunEnded`` — a crashed Run returns to running only through a resume — and a pending one
    ``Conflict`` (start it first).
    """
    policy.require_run_writer(actor, run)
    lease_check(run_id=run.pk, token=fencing_token)
    now = timezone.now()
    beaten = Run.objects.filter(pk=run.pk, status__in=LIVE_STATES).update(heartbeat_at=now)
    run.refresh_from_db()
    if beaten:
        return run
    if run.status in FINAL_STATES:
        raise RunEnded(_ended_message(run.external_id, run.status), field="status")
    raise Conflict(
        f"run {run.external_id} is {run.status}: start it (start_run) before it sends heartbeats", field="status"
    )


def runs_reap_crashed(now=None) -> int:
    """End every live Run whose SDK heartbeat is older than ``MMT_CRASH_TIMEOUT`` s; how many it ended
    (docs/design/runs.md#states).

    ``now`` (an aware datetime, default the current time) is for tests.
    running → ``crashed``, preempting → ``preempted``, ``ended_at`` = now.
    Never reaped: a Run that never sent a heartbeat (``heartbeat_at`` null,
    e.g. one created through the MLflow API), and a Run whose Job's worker
    vouches for it (``Run.job_alive_until`` lies ahead: the jobs app writes
    it at each worker heartbeat; the Job reaper handles a lost worker). Each Run is
    ended under its row lock after re-reading it, so a heartbeat or resume
    that commits first spares it, and one that comes after finds it ended.
    Each ended Run gets ``run_ended_effects`` (its sweep trial is told).
    Called by beat every 60 s (``runs.tasks.reap_crashed_runs``).
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.MMT_CRASH_TIMEOUT)
    stale = Run.objects.filter(status__in=LIVE_STATES, heartbeat_at__lt=cutoff)
    reaped = 0
    for run_id in stale.values_list("pk", flat=True):
        if _reap_one(run_id=run_id, cutoff=cutoff, now=now):
            reaped += 1
    return reaped + runs_reap_silent(now=now)


def run_touch(*, run_id: int) -> None:
    """Record a write to Run ``run_id`` by a writer that sends no heartbeats (``last_write_at`` = now;
    docs/design/runs.md#liveness).

    A Run that beats is judged by its heartbeats, so its row is not written.
    """
    Run.objects.filter(pk=run_id, heartbeat_at__isnull=True).update(last_write_at=timezone.now())


_WRITER_ROW = (
    f"SELECT lease_token, writer_host, writer_pid, status, external_id FROM {Run._meta.db_table} WHERE id = %s"
)


def write_guard(*, run_id: int, fencing_token: int | None) -> Callable[[], None]:
    """Send the read of Run ``run_id``'s row that decides whether a write goes on; return the check of it.

    Call it first in the writing transaction; inside ``mado.db.pipelined``
    the read travels with the writes sent after it, and the check, called
    after the block, raises: ``LeaseLost`` for a stale ``fencing_token``
    (None: not fenced; a fenced read locks the row ``FOR UPDATE``, so a
    takeover waits for this write or sees it refused; docs/design/runs.md#one-writer-process), else
    ``RunEnded`` (409 ``run_ended``) when the Run was ended ``crashed`` (the
    reaper took its process for dead: what it still sends is not stored,
    the SDK keeps it for a same-run resume; docs/design/runs.md#liveness). A reap that commits first
    is seen, one that comes later waits. The raise rolls back the
    transaction, so nothing of a refused write is kept.
    """
    if fencing_token is not None and not connection.in_atomic_block:
        raise RuntimeError("write_guard must run inside the writing transaction")
    cursor = connection.cursor()
    locked = fencing_token is not None and connection.features.has_select_for_update
    cursor.execute(_WRITER_ROW + (" FOR UPDATE" if locked else ""), [run_id])

    def check() -> None:
        with cursor:
            row = cursor.fetchone()
        if row is None:
            return
        lease_token, writer_host, writer_pid, status, external_id = row
        if fencing_token is not None:
            current = {"lease_token": lease_token, "writer_host": writer_host, "writer_pid": writer_pid}
            refuse_stale_token(run_id=run_id, token=fencing_token, current=current)
        if status == RunStatus.CRASHED:
            raise RunEnded(_ended_message(external_id, status), field="status")

    return check


def runs_reap_silent(*, now=None) -> int:
    """End as ``crashed`` every running Run that never sent a heartbeat and had no write for its timeout
    (docs/design/runs.md#liveness).

    The timeout is the Project's ``silent_run_timeout`` or
    ``MMT_SILENT_RUN_TIMEOUT`` seconds, counted from the last write
    (``last_write_at``, else the start). A Run whose Job vouches for it is
    spared. ``ended_reason`` names the silence. Returns how many Runs it ended.
    """
    now = now or timezone.now()
    shortest = min(
        [
            settings.MMT_SILENT_RUN_TIMEOUT,
            *Project.objects.filter(silent_run_timeout__isnull=False).values_list("silent_run_timeout", flat=True),
        ]
    )
    candidates = (
        Run.objects.filter(status=RunStatus.RUNNING, heartbeat_at__isnull=True)
        .annotate(last=Coalesce("last_write_at", "started_at", "created_at"))
        .filter(last__lt=now - timedelta(seconds=shortest))
        .values_list("pk", "last", "project__silent_run_timeout")
    )
    reaped = 0
    for run_id, last, timeout in candidates:
        timeout = timeout or settings.MMT_SILENT_RUN_TIMEOUT
        if last < now - timedelta(seconds=timeout) and _reap_silent_one(
            run_id=run_id, last=last, timeout=timeout, now=now
        ):
            reaped += 1
    return reaped


def _kept_alive(run: Run, now) -> bool:
    """True while ``run``'s Job's worker vouches for it (a fact the jobs app writes; none: False)."""
    return run.job_alive_until is not None and run.job_alive_until >= now


@transaction.atomic
def _reap_silent_one(*, run_id: int, last, timeout: int, now) -> bool:
    run = Run.objects.select_for_update().filter(pk=run_id, status=RunStatus.RUNNING, heartbeat_at__isnull=True).first()
    if run is None or (run.last_write_at or run.started_at or run.created_at) != last or _kept_alive(run, now):
        return False
    reason = (
        f"no heartbeat and no write since {last.isoformat(timespec='seconds')}: "
        f"silent for more than {timeout} s, the process is taken for dead"
    )
    Run.objects.filter(pk=run_id).update(status=RunStatus.CRASHED, ended_at=now, ended_reason=reason)
    logger.warning("run %s (%s) marked crashed: %s", run_id, run.external_id, reason)
    run.refresh_from_db()
    run_ended_effects(run=run)
    return True


@transaction.atomic
def _reap_one(*, run_id: int, cutoff, now) -> bool:
    run = Run.objects.select_for_update().filter(pk=run_id, status__in=LIVE_STATES, heartbeat_at__lt=cutoff).first()
    if run is None or _kept_alive(run, now):
        return False
    status = REAPED_STATUS[run.status]
    reason = (
        f"no heartbeat since {run.heartbeat_at.isoformat(timespec='seconds')} "
        f"(more than {settings.MMT_CRASH_TIMEOUT} s)"
    )
    if not Run.objects.filter(pk=run_id, status=run.status, heartbeat_at=run.heartbeat_at).update(
        status=status, ended_at=now, ended_reason=reason
    ):
        return False
    logger.warning(
        "run %s (%s) marked %s: no heartbeat since %s (MMT_CRASH_TIMEOUT=%s s)",
        run_id,
        run.external_id,
        status,
        run.heartbeat_at.isoformat(timespec="seconds"),
        settings.MMT_CRASH_TIMEOUT,
    )
    run.refresh_from_db()
    run_ended_effects(run=run)
    return True
