"""Is a Run's process still alive? Heartbeats, the crash reaper and what follows a Run's end (SPEC F26, F28).

The SDK sends ``POST runs/{id}/heartbeat/`` every ``MMT_HEARTBEAT_INTERVAL``
seconds (``run_heartbeat``). Beat calls ``runs_reap_crashed`` every 60 s: a
running Run silent for ``MMT_CRASH_TIMEOUT`` seconds becomes ``crashed``, a
preempting one ``preempted``. Both write under the Run's row lock (or a
conditional UPDATE on the status), so a heartbeat, a resume and the reaper
never both win: a Run the reaper ended answers a late heartbeat with
``RunEnded``, and only a resume (``POST runs/``) makes it run again.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from mado import policy
from mado.errors import Conflict, RunEnded
from runs import hooks
from runs.lease import lease_check
from runs.models import FINAL_STATES, Run, RunStatus
from runs.sweeps.hooks import sweep_trial_run_ended

logger = logging.getLogger("runs")

LIVE_STATES = (RunStatus.RUNNING, RunStatus.PREEMPTING)
# What a silent Run becomes: a preempting one was told to stop, so its silence is the preemption.
REAPED_STATUS = {RunStatus.RUNNING: RunStatus.CRASHED, RunStatus.PREEMPTING: RunStatus.PREEMPTED}


def run_ended_effects(*, run: Run) -> None:
    """What follows ``run`` reaching a final state, inside the transaction that ended it (SPEC F3, F28).

    A sweep trial's Run tells its trial (a preempted one goes back to the
    queue), and the ``runs.hooks.run_ended`` receivers run (the checkpoints
    app completes files logged under ``checkpoints/step-N/`` through the
    MLflow API). Callers call it once per change of status.
    """
    sweep_trial_run_ended(run=run)
    hooks.run_ended.send(sender=None, run=run)


def _ended_message(run: Run) -> str:
    """The ``RunEnded`` text for ``run`` (in a final state): how to continue it."""
    return (
        f"run {run.external_id} ended as {run.status}; resume it "
        f"(start_run(id={run.external_id!r}, resume='allow')) to continue"
    )


@transaction.atomic
def run_heartbeat(*, actor, run: Run, fencing_token: int | None) -> Run:
    """Record that ``run``'s process is alive: ``heartbeat_at`` = now (SPEC F26); the Run as stored.

    Only a writer of the Run (``policy.why_cannot_write_run``, F31; else ``Forbidden``). ``fencing_token``
    (the ``Mado-Fencing-Token`` header, None: not fenced) is checked under
    the Run's row lock: a stale one raises ``LeaseLost``. Only a running or
    preempting Run beats (conditional UPDATE on those states); one in a
    final state raises ``RunEnded`` — a crashed Run returns to running only
    through a resume — and a pending one ``Conflict`` (start it first).
    """
    policy.require_run_writer(actor, run)
    lease_check(run_id=run.pk, token=fencing_token)
    now = timezone.now()
    beaten = Run.objects.filter(pk=run.pk, status__in=LIVE_STATES).update(heartbeat_at=now)
    run.refresh_from_db()
    if beaten:
        return run
    if run.status in FINAL_STATES:
        raise RunEnded(_ended_message(run), field="status")
    raise Conflict(f"run {run.external_id} is {run.status}: start it (start_run) before it sends heartbeats", field="status")


def runs_reap_crashed(now=None) -> int:
    """End every live Run whose SDK heartbeat is older than ``MMT_CRASH_TIMEOUT`` s; how many it ended (SPEC F26).

    ``now`` (an aware datetime, default the current time) is for tests.
    running → ``crashed``, preempting → ``preempted``, ``ended_at`` = now.
    Never reaped: a Run that never sent a heartbeat (``heartbeat_at`` null,
    e.g. one created through the MLflow API), and a Run that a
    ``runs.hooks.run_kept_alive`` receiver vouches for (the jobs app: its
    Job is running with a fresh worker heartbeat; the Job reaper handles a
    lost worker). Each Run is
    ended under its row lock after re-reading it, so a heartbeat or resume
    that commits first spares it, and one that comes after finds it ended.
    Each ended Run gets ``run_ended_effects`` (its sweep trial is told).
    Called by beat every 60 s (``jobs.tasks.reap_crashed_runs``).
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.MMT_CRASH_TIMEOUT)
    stale = Run.objects.filter(status__in=LIVE_STATES, heartbeat_at__lt=cutoff)
    reaped = 0
    for run_id in stale.values_list("pk", flat=True):
        if _reap_one(run_id=run_id, cutoff=cutoff, now=now):
            reaped += 1
    return reaped


@transaction.atomic
def _reap_one(*, run_id: int, cutoff, now) -> bool:
    run = Run.objects.select_for_update().filter(pk=run_id, status__in=LIVE_STATES, heartbeat_at__lt=cutoff).first()
    if run is None or hooks.any_receiver_says(hooks.run_kept_alive, run_id=run_id, now=now):
        return False
    status = REAPED_STATUS[run.status]
    if not Run.objects.filter(pk=run_id, status=run.status, heartbeat_at=run.heartbeat_at).update(status=status, ended_at=now):
        return False
    logger.warning(
        "run %s (%s) marked %s: no heartbeat since %s (MMT_CRASH_TIMEOUT=%s s)",
        run_id, run.external_id, status, run.heartbeat_at.isoformat(timespec="seconds"), settings.MMT_CRASH_TIMEOUT,
    )
    run.refresh_from_db()
    run_ended_effects(run=run)
    return True
