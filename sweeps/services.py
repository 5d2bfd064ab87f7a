"""State changes of Sweeps and their trials (docs/design/sweeps.md#sweeps, #requeue): create, claim, report, lease
expiry.

A claim hands an agent one trial. Queued trials (requeued after a
preemption, or whose claim expired) go first, oldest first, each taken with
``SELECT … FOR UPDATE SKIP LOCKED`` plus a conditional UPDATE on its state,
so two agents never get one trial. Otherwise a new parameter set becomes a
trial under the Sweep's row lock while trials < ``run_cap``; the database
holds ``(sweep, number)`` unique. The trial's Run is created ``pending`` in
the same transaction; the program attaches to it (or resumes it) with
``MMT_RUN_ID`` + ``MMT_RESUME=allow``, which tells the trial through
``sweeps.hooks``.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, Q
from django.utils import timezone

from mado import policy
from mado.errors import Conflict, Forbidden
from runs import services as run_services
from runs.models import Project, Run, RunStatus
from sweeps import selectors
from sweeps.config import sweep_config_parse
from sweeps.models import Sweep, SweepTrial, TrialState
from sweeps.suggest import suggest_parameters

# Attempts at taking a queued trial: on SQLite the row lock is a no-op and the conditional UPDATE may lose.
CLAIM_ATTEMPTS = 5


@transaction.atomic
def sweep_create(*, actor, project: Project, config) -> Sweep:
    """Create a Sweep in ``project`` from ``config`` (YAML/JSON text or a dict; ``sweeps.config``).
    docs/design/sweeps.md#sweeps.

    Member or admin (``Forbidden`` otherwise). Raises ``ValidationFailed``
    naming the configuration field (``method``, ``metric.name``,
    ``parameters``, ``program``, ``run_cap``...). No trial exists until an
    agent claims one.
    """
    policy.require_role(actor, project, policy.MEMBER)
    parsed = sweep_config_parse(config=config)
    return Sweep.objects.create(
        project=project,
        name=parsed.name,
        method=parsed.method,
        parameters=parsed.parameters,
        metric_name=parsed.metric_name,
        metric_goal=parsed.metric_goal,
        program=parsed.program,
        run_cap=parsed.run_cap,
        config=parsed.config,
        created_by=actor,
    )


@dataclass(frozen=True)
class SweepClaim:
    """The answer to a claim: the trial (None when none is available), its Run's newest complete checkpoint,
    ``done`` (the sweep will hand out nothing more) and ``reason`` (one sentence for the agent's log)."""

    trial: SweepTrial | None
    latest_checkpoint: object | None  # the trial Run's newest usable checkpoints.Checkpoint
    done: bool
    reason: str


def _claim_queued(*, actor, sweep: Sweep, agent: str, now: datetime, until: datetime) -> SweepTrial | None:
    waiting = (
        SweepTrial.objects.filter(sweep=sweep)
        .filter(Q(state=TrialState.QUEUED) | Q(state=TrialState.LEASED, lease_expires_at__lt=now))
        .order_by("number")
    )
    for _attempt in range(CLAIM_ATTEMPTS):
        with transaction.atomic():
            trial = waiting.select_for_update(skip_locked=True).first()
            if trial is None:
                return None
            taken = SweepTrial.objects.filter(
                pk=trial.pk, state=trial.state, lease_expires_at=trial.lease_expires_at
            ).update(state=TrialState.LEASED, agent=agent, claimed_by=actor, claimed_at=now, lease_expires_at=until)
            if not taken:
                continue
            # A Run its program never started is attached by its creator only: the new claimer takes it over.
            Run.objects.filter(pk=trial.run_id, status=RunStatus.PENDING).update(created_by=actor)
            return SweepTrial.objects.select_related("run").get(pk=trial.pk)
    return None


@transaction.atomic
def _claim_new(*, actor, sweep: Sweep, agent: str, now: datetime, until: datetime) -> SweepTrial | None:
    locked = Sweep.objects.select_for_update().get(pk=sweep.pk)
    number = (locked.trials.aggregate(last=Max("number"))["last"] or 0) + 1
    if locked.run_cap is not None and number > locked.run_cap:
        return None
    parameters = suggest_parameters(
        sweep=locked, number=number, finished=selectors.sweep_finished_results(sweep=locked)
    )
    if parameters is None:
        return None
    run = run_services.run_create(
        actor=actor,
        project=sweep.project,
        name=f"{locked.name or f'sweep-{locked.pk}'}-{number}",
        parameters=parameters,
        status=RunStatus.PENDING,
    )
    return SweepTrial.objects.create(
        sweep=locked,
        number=number,
        run=run,
        parameters=parameters,
        state=TrialState.LEASED,
        agent=agent,
        claimed_by=actor,
        claimed_at=now,
        lease_expires_at=until,
    )


def sweep_claim(*, actor, sweep: Sweep, agent: str = "", now: datetime | None = None) -> SweepClaim:
    """Hand the next trial of ``sweep`` to the agent ``agent`` (``host:pid``) of ``actor``
    (docs/design/sweeps.md#sweeps, #requeue).

    Order: queued trials first (requeued after preemption, or leased with
    ``lease_expires_at`` < ``now``), lowest number first; else a new
    parameter set while trials < ``run_cap`` (a new trial and its ``pending``
    Run, created by ``actor``, named ``<sweep name>-<number>``). The trial
    becomes ``leased`` until ``now + MMT_SWEEP_LEASE`` seconds. Atomic under
    concurrency: no two claims get one trial. With no trial to give,
    ``done`` is True when the cap is reached and no trial is queued, leased
    or running (else the agent asks again later). ``now`` defaults to the
    current time (tests inject it). Member or admin (``Forbidden``).
    """
    policy.require_role(actor, sweep.project, policy.MEMBER)
    now = now or timezone.now()
    until = now + timedelta(seconds=settings.MMT_SWEEP_LEASE)
    trial = _claim_queued(actor=actor, sweep=sweep, agent=agent, now=now, until=until)
    if trial is not None:
        if trial.run.started_at is not None:
            reason = f"trial {trial.number} (run {trial.run.external_id}) was preempted: resume it"
        elif trial.retry_count:
            reason = f"trial {trial.number} was retried: a fresh run with the same parameters"
        else:
            reason = f"trial {trial.number} was queued again: its previous claim expired before its program started"
        return SweepClaim(trial, selectors.trial_latest_checkpoint(trial=trial), False, reason)
    trial = _claim_new(actor=actor, sweep=sweep, agent=agent, now=now, until=until)
    if trial is not None:
        return SweepClaim(trial, None, False, f"trial {trial.number} is a new parameter set")
    counts = selectors.sweep_trial_counts(sweep=sweep)
    if counts[TrialState.QUEUED] + counts[TrialState.LEASED] + counts[TrialState.RUNNING] == 0:
        return SweepClaim(None, None, True, f"all {counts['total']} trials of the sweep ended (run cap reached)")
    return SweepClaim(None, None, False, "every remaining trial is claimed or running; ask again later")


def _took_over_elsewhere(run: Run, trial: SweepTrial) -> bool:
    """True when the Run's current writer started before this claim: the claimer's program never took it over
    (refused as live), so its exit says nothing about the Run."""
    return run.writer_since is not None and trial.claimed_at is not None and run.writer_since < trial.claimed_at


@transaction.atomic
def sweep_trial_report(
    *, actor, trial: SweepTrial, exit_code: int, preempted: bool = False, agent: str = ""
) -> SweepTrial:
    """Record how the program of ``trial`` exited (the agent's report; docs/design/sweeps.md#sweeps, #requeue); the
    trial as stored.

    If the trial's Run has not ended, it is ended through
    ``runs.services.run_set_status``: preempted when ``preempted`` or the
    Run is preempting, finished on ``exit_code`` 0, else failed; a preempted
    Run sends the trial back to the queue (``hooks.sweep_trial_run_ended``).
    A Run the program never started stays ``pending`` when preempted (the
    trial is requeued directly) so the next agent can start it. Nothing
    changes when the Run already ended (idempotent), when the report is
    stale (the trial is queued again, or ``agent`` is given and another
    agent holds the trial now) or when another process took the Run over
    before this claim. Past a stale report, only who may write to the trial's Run reports it
    (docs/design/runs.md#write-rule: its claimer, who created it, or a Project admin; ``Forbidden`` for any
    other member, a done trial's too).
    """
    policy.require_role(actor, trial.sweep.project, policy.MEMBER)
    trial = SweepTrial.objects.select_for_update().get(pk=trial.pk)
    # The trial row is locked above; PostgreSQL refuses FOR UPDATE on the outer join to it.
    run = Run.objects.select_for_update(of=("self", "project")).select_related("project", "sweep_trial")
    run = run.get(pk=trial.run_id)
    stale = trial.state == TrialState.QUEUED or (agent and agent != trial.agent)
    refusal = None if stale else policy.why_cannot_write_run(actor, run)  # the claimer (its creator), an admin
    if refusal:
        raise Forbidden(refusal)
    if run.is_final or stale or _took_over_elsewhere(run, trial):
        return SweepTrial.objects.select_related("run").get(pk=trial.pk)
    if run.status == RunStatus.PENDING and preempted:
        SweepTrial.objects.filter(pk=trial.pk).exclude(state=TrialState.QUEUED).update(
            state=TrialState.QUEUED, requeue_count=F("requeue_count") + 1, agent="", lease_expires_at=None
        )
    else:
        if preempted or run.status == RunStatus.PREEMPTING:
            status = RunStatus.PREEMPTED
        else:
            status = RunStatus.FINISHED if exit_code == 0 else RunStatus.FAILED
        run_services.run_set_status(actor=actor, run=run, status=status)
    return SweepTrial.objects.select_related("run").get(pk=trial.pk)


RETRYABLE = frozenset({RunStatus.FAILED, RunStatus.CRASHED, RunStatus.ABORTED})


@transaction.atomic
def sweep_trial_retry(*, actor, trial: SweepTrial) -> SweepTrial:
    """Give the failed ``trial`` a fresh attempt: a new ``pending`` Run with the same parameters, queued for the
    next agent's claim (docs/design/sweeps.md#requeue). Returns the trial as stored, with its new Run.

    Who may: whoever may run the sweep's agent (member or admin; ``Forbidden``
    otherwise). Only a trial that is done with its Run failed, crashed or
    aborted is retried; any other (queued, claimed, running, finished, or
    already retried by a first click) raises ``Conflict`` saying what it is,
    and nothing changes. The earlier Run is kept unchanged and listed in
    ``earlier_runs``; the trial's ``retry_count`` grows by one. The new Run
    is created by ``actor`` and named ``<sweep>-<number>-retry<k>``. Two
    concurrent retries: one wins, the other's conditional UPDATE matches no
    row and it raises ``Conflict`` (its new Run rolled back with it).
    """
    policy.require_role(actor, trial.sweep.project, policy.MEMBER)
    trial = SweepTrial.objects.select_for_update().select_related("run", "sweep").get(pk=trial.pk)
    if trial.state != TrialState.DONE or trial.run.status not in RETRYABLE:
        raise Conflict(_retry_refusal(trial), field="trial")
    old_run = trial.run
    attempt = trial.retry_count + 1
    run = run_services.run_create(
        actor=actor,
        project=trial.sweep.project,
        parameters=trial.parameters,
        status=RunStatus.PENDING,
        name=f"{trial.sweep.name or f'sweep-{trial.sweep_id}'}-{trial.number}-retry{attempt}",
    )
    taken = SweepTrial.objects.filter(pk=trial.pk, state=TrialState.DONE, run_id=old_run.pk).update(
        run=run,
        state=TrialState.QUEUED,
        retry_count=F("retry_count") + 1,
        agent="",
        claimed_by=None,
        claimed_at=None,
        lease_expires_at=None,
    )
    if not taken:
        raise Conflict(f"trial {trial.number} was retried by someone else a moment ago", field="trial")
    trial.earlier_runs.add(old_run)
    return SweepTrial.objects.select_related("run").get(pk=trial.pk)


def _retry_refusal(trial: SweepTrial) -> str:
    if trial.state != TrialState.DONE:
        if trial.retry_count and trial.state == TrialState.QUEUED:
            return (
                f"trial {trial.number} was already retried: its new run {trial.run.external_id} is waiting for an agent"
            )
        return f"trial {trial.number} is {trial.get_state_display()}: only a failed trial can be retried"
    return f"trial {trial.number} ended {trial.run.status}: only a failed, crashed or aborted trial can be retried"


def sweep_release_expired_leases(*, now: datetime | None = None) -> int:
    """Return trials whose claim expired (leased, ``lease_expires_at`` < ``now``) to the queue
    (docs/design/sweeps.md#requeue).

    The agent that claimed them died or its program never started the Run
    within ``MMT_SWEEP_LEASE``. One conditional UPDATE; returns how many
    trials were released. ``now`` defaults to the current time. Claims also
    take expired trials directly, so this only keeps the pages truthful.
    """
    now = now or timezone.now()
    return SweepTrial.objects.filter(state=TrialState.LEASED, lease_expires_at__lt=now).update(
        state=TrialState.QUEUED, agent="", lease_expires_at=None
    )
