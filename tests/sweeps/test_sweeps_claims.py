"""Claims, reports, lease expiry and the Run hooks of sweep trials (docs/design/sweeps.md#sweeps, #requeue).

Time is injected (``now``), never slept.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from checkpoints.models import Checkpoint, CheckpointState
from mado.errors import Forbidden
from runs.models import Membership, Role, Run, RunStatus
from runs.services import run_set_status
from sweeps.hooks import sweep_trial_run_ended, sweep_trial_run_started
from sweeps.models import SweepTrial, TrialState
from sweeps.services import sweep_claim, sweep_release_expired_leases, sweep_trial_report
from sweeps.suggest import suggest_parameters
from tests.factories import UserFactory
from tests.sweeps.sweep_helpers import RANDOM, log_metric, make_sweep, start_program

pytestmark = pytest.mark.django_db


@pytest.fixture
def grid(project, member):
    return make_sweep(actor=member, project=project)


def finish(actor, trial, status=RunStatus.FINISHED):
    run = start_program(actor=actor, trial=trial)
    return run_set_status(actor=actor, run=run, status=status)


def test_grid_covers_every_point_once_then_is_done(grid, member):
    claims = [sweep_claim(actor=member, sweep=grid, agent=f"host:{i}") for i in range(4)]
    points = {(c.trial.parameters["lr"], c.trial.parameters["hidden"]) for c in claims}
    assert points == {(0.1, 32), (0.1, 64), (0.01, 32), (0.01, 64)}
    assert [c.trial.number for c in claims] == [1, 2, 3, 4]
    assert all(c.trial.parameters["epochs"] == 3 for c in claims)
    waiting = sweep_claim(actor=member, sweep=grid, agent="host:9")
    assert (waiting.trial, waiting.done) == (None, False)
    assert "ask again" in waiting.reason
    for claim in claims:
        finish(member, claim.trial)
    done = sweep_claim(actor=member, sweep=grid, agent="host:9")
    assert (done.trial, done.done) == (None, True)
    assert SweepTrial.objects.filter(sweep=grid).count() == 4


def test_the_grid_order_is_deterministic(project, member):
    first = [
        sweep_claim(actor=member, sweep=make_sweep(actor=member, project=project), agent="a").trial.parameters
        for _ in range(2)
    ]
    assert first[0] == first[1] == {"epochs": 3, "hidden": 32, "lr": 0.1}


def test_a_claim_creates_a_pending_run_of_the_claimer_with_the_trial_parameters(grid, member):
    now = timezone.now()
    trial = sweep_claim(actor=member, sweep=grid, agent="gpu-1:77", now=now).trial
    run = trial.run
    assert (run.status, run.created_by, run.parameters, run.name) == (
        RunStatus.PENDING,
        member,
        trial.parameters,
        "digits-1",
    )
    assert (trial.state, trial.agent, trial.lease_expires_at) == (
        TrialState.LEASED,
        "gpu-1:77",
        now + timedelta(seconds=3600),
    )


def test_random_suggestions_stay_within_bounds_and_differ(project, member):
    sweep = make_sweep(actor=member, project=project, base=RANDOM)
    trials = [sweep_claim(actor=member, sweep=sweep, agent="a").trial for _ in range(12)]
    for trial in trials:
        p = trial.parameters
        assert 1e-4 <= p["lr"] <= 1e-1 and 8 <= p["hidden"] <= 128 and isinstance(p["hidden"], int)
        assert 0 <= p["dropout"] <= 0.5 and p["optimizer"] in ("adam", "sgd")
    assert len({t.parameters["lr"] for t in trials}) == 12


@pytest.mark.parametrize("method", ["random", "bayes"])
def test_suggestions_are_reproducible_for_a_sweep_and_its_history(project, member, method):
    sweep = make_sweep(actor=member, project=project, base=RANDOM, method=method)
    history = [({"lr": 0.01 * i, "hidden": 10 + i, "dropout": 0.1, "optimizer": "adam"}, float(i)) for i in range(1, 9)]
    again = [suggest_parameters(sweep=sweep, number=9, finished=history) for _ in range(2)]
    assert again[0] == again[1]
    assert suggest_parameters(sweep=sweep, number=10, finished=history) != again[0]
    claimed = sweep_claim(actor=member, sweep=sweep, agent="a").trial
    assert claimed.parameters == suggest_parameters(sweep=sweep, number=1, finished=[])


def test_bayes_learns_from_finished_trials_with_their_last_metric(project, member):
    sweep = make_sweep(actor=member, project=project, base=RANDOM, method="bayes")
    for number in range(1, 4):
        trial = sweep_claim(actor=member, sweep=sweep, agent="a").trial
        run = start_program(actor=member, trial=trial)
        log_metric(actor=member, run=run, key="acc", values=[0.1, 0.2 * number])
        run_set_status(actor=member, run=run, status=RunStatus.FINISHED)
    from sweeps.selectors import sweep_finished_results

    results = sweep_finished_results(sweep=sweep)
    assert sorted(value for _params, value in results) == pytest.approx([0.2, 0.4, 0.6])
    trial = sweep_claim(actor=member, sweep=sweep, agent="a").trial
    assert trial.parameters == suggest_parameters(sweep=sweep, number=4, finished=results)


def test_a_preempted_trial_is_requeued_and_claimed_before_new_ones(grid, member, admin):
    first = sweep_claim(actor=member, sweep=grid, agent="a:1").trial
    sweep_claim(actor=member, sweep=grid, agent="a:2")
    run = start_program(actor=member, trial=first)
    first.refresh_from_db()
    assert (first.state, first.lease_expires_at) == (TrialState.RUNNING, None)
    Checkpoint.objects.create(run=run, step=10, state=CheckpointState.COMPLETE)
    newest = Checkpoint.objects.create(run=run, step=20, state=CheckpointState.COMPLETE)
    Checkpoint.objects.create(run=run, step=30, state=CheckpointState.PENDING)
    run_set_status(actor=member, run=run, status=RunStatus.PREEMPTING)
    run_set_status(actor=member, run=run, status=RunStatus.FAILED)  # a preempting run that fails ends preempted
    first.refresh_from_db()
    assert (first.state, first.requeue_count, first.agent) == (TrialState.QUEUED, 1, "")
    claim = sweep_claim(actor=admin, sweep=grid, agent="b:1")
    assert claim.trial.pk == first.pk and claim.trial.run.external_id == run.external_id
    assert claim.latest_checkpoint == newest
    assert "preempted" in claim.reason
    resumed = start_program(actor=admin, trial=claim.trial, pid=99)
    assert (resumed.pk, resumed.status, resumed.resume_count) == (run.pk, RunStatus.RUNNING, 1)
    assert sweep_claim(actor=admin, sweep=grid, agent="b:2").trial.number == 3


def test_an_expired_lease_returns_the_trial_to_another_agent(grid, member, admin, settings):
    settings.MMT_SWEEP_LEASE = 60
    now = timezone.now()
    trial = sweep_claim(actor=member, sweep=grid, agent="dead:1", now=now).trial
    assert sweep_claim(actor=admin, sweep=grid, agent="b:1", now=now + timedelta(seconds=59)).trial.number == 2
    again = sweep_claim(actor=admin, sweep=grid, agent="b:2", now=now + timedelta(seconds=61)).trial
    assert (again.pk, again.agent, again.requeue_count) == (trial.pk, "b:2", 0)
    assert again.lease_expires_at == now + timedelta(seconds=121)
    # The new claimer's program attaches to the never-started Run (attach is for the Run's creator).
    assert start_program(actor=admin, trial=again).status == RunStatus.RUNNING


def test_release_expired_leases_queues_only_expired_claims(grid, member, settings):
    settings.MMT_SWEEP_LEASE = 60
    now = timezone.now()
    old = sweep_claim(actor=member, sweep=grid, agent="a", now=now).trial
    sweep_claim(actor=member, sweep=grid, agent="b", now=now + timedelta(seconds=30))
    assert sweep_release_expired_leases(now=now + timedelta(seconds=59)) == 0
    assert sweep_release_expired_leases(now=now + timedelta(seconds=61)) == 1
    old.refresh_from_db()
    assert (old.state, old.agent, old.lease_expires_at) == (TrialState.QUEUED, "", None)
    assert sweep_claim(actor=member, sweep=grid, agent="c", now=now + timedelta(seconds=62)).trial.pk == old.pk


def test_a_started_trial_never_expires(grid, member, settings):
    now = timezone.now()
    trial = sweep_claim(actor=member, sweep=grid, agent="a", now=now).trial
    start_program(actor=member, trial=trial)
    later = now + timedelta(seconds=settings.MMT_SWEEP_LEASE * 2)
    assert sweep_release_expired_leases(now=later) == 0
    assert sweep_claim(actor=member, sweep=grid, agent="b", now=later).trial.number == 2


@pytest.mark.parametrize(
    ("exit_code", "preempted", "mark_preempting", "run_status", "trial_state", "requeues"),
    [
        (0, False, False, RunStatus.FINISHED, TrialState.DONE, 0),
        (1, False, False, RunStatus.FAILED, TrialState.DONE, 0),
        (-9, True, False, RunStatus.PREEMPTED, TrialState.QUEUED, 1),
        (1, False, True, RunStatus.PREEMPTED, TrialState.QUEUED, 1),
        (0, False, True, RunStatus.PREEMPTED, TrialState.QUEUED, 1),  # told to stop: requeued to finish
    ],
)
def test_a_report_ends_a_run_its_program_left_open(
    grid, member, exit_code, preempted, mark_preempting, run_status, trial_state, requeues
):
    trial = sweep_claim(actor=member, sweep=grid, agent="a").trial
    run = start_program(actor=member, trial=trial)
    if mark_preempting:
        run_set_status(actor=member, run=run, status=RunStatus.PREEMPTING)
    trial = sweep_trial_report(actor=member, trial=trial, exit_code=exit_code, preempted=preempted)
    assert (trial.run.status, trial.state, trial.requeue_count) == (run_status, trial_state, requeues)
    again = sweep_trial_report(actor=member, trial=trial, exit_code=exit_code, preempted=preempted)
    assert (again.run.status, again.state, again.requeue_count) == (run_status, trial_state, requeues)


def test_a_report_after_the_program_ended_its_run_changes_nothing(grid, member):
    trial = sweep_claim(actor=member, sweep=grid, agent="a").trial
    finish(member, trial)
    trial = sweep_trial_report(actor=member, trial=trial, exit_code=3)
    assert (trial.run.status, trial.state) == (RunStatus.FINISHED, TrialState.DONE)


def test_a_program_preempted_before_starting_its_run_leaves_it_pending_and_requeues(grid, member, admin):
    trial = sweep_claim(actor=member, sweep=grid, agent="a").trial
    trial = sweep_trial_report(actor=member, trial=trial, exit_code=-15, preempted=True)
    assert (trial.run.status, trial.state, trial.requeue_count) == (RunStatus.PENDING, TrialState.QUEUED, 1)
    again = sweep_claim(actor=admin, sweep=grid, agent="b").trial
    assert again.pk == trial.pk
    assert start_program(actor=admin, trial=again).status == RunStatus.RUNNING


def test_a_program_failing_before_starting_its_run_ends_the_trial(grid, member):
    trial = sweep_claim(actor=member, sweep=grid, agent="a").trial
    trial = sweep_trial_report(actor=member, trial=trial, exit_code=2)
    assert (trial.run.status, trial.state) == (RunStatus.FAILED, TrialState.DONE)


def test_a_stale_report_does_not_end_another_agents_trial(grid, member, admin, settings):
    settings.MMT_SWEEP_LEASE = 60
    now = timezone.now()
    trial = sweep_claim(actor=member, sweep=grid, agent="slow:1", now=now).trial
    sweep_claim(actor=admin, sweep=grid, agent="fast:1", now=now + timedelta(seconds=61))
    trial = sweep_trial_report(actor=member, trial=trial, exit_code=1, agent="slow:1")
    assert (trial.run.status, trial.state, trial.agent) == (RunStatus.PENDING, TrialState.LEASED, "fast:1")


def test_a_report_from_an_agent_whose_program_was_refused_leaves_the_live_run_alone(grid, member, admin, settings):
    settings.MMT_SWEEP_LEASE = 60
    trial = sweep_claim(actor=member, sweep=grid, agent="a", now=timezone.now() - timedelta(seconds=120)).trial
    start_program(actor=member, trial=trial)  # started after its lease expired, while agent b claimed the trial:
    SweepTrial.objects.filter(pk=trial.pk).update(state=TrialState.LEASED, agent="b", claimed_at=timezone.now())
    trial = sweep_trial_report(actor=admin, trial=trial, exit_code=1)
    assert trial.run.status == RunStatus.RUNNING


def test_hooks_move_the_trial_with_its_run(grid, member):
    trial = sweep_claim(actor=member, sweep=grid, agent="a").trial
    run = trial.run
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    sweep_trial_run_started(run=run)
    trial.refresh_from_db()
    assert (trial.state, trial.lease_expires_at, trial.agent) == (TrialState.RUNNING, None, "a")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.PREEMPTED)
    sweep_trial_run_ended(run=run)
    sweep_trial_run_ended(run=run)  # told twice: requeued once
    trial.refresh_from_db()
    assert (trial.state, trial.requeue_count, trial.agent) == (TrialState.QUEUED, 1, "")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FINISHED)
    sweep_trial_run_ended(run=run)
    trial.refresh_from_db()
    assert (trial.state, trial.requeue_count) == (TrialState.DONE, 1)


def test_hooks_ignore_runs_outside_sweeps(run):
    sweep_trial_run_started(run=run)
    sweep_trial_run_ended(run=run)
    assert not SweepTrial.objects.exists()


def test_a_viewer_cannot_claim_or_report(grid, member, viewer):
    with pytest.raises(Forbidden):
        sweep_claim(actor=viewer, sweep=grid, agent="v")
    trial = sweep_claim(actor=member, sweep=grid, agent="a").trial
    with pytest.raises(Forbidden):
        sweep_trial_report(actor=viewer, trial=trial, exit_code=0)
    assert not SweepTrial.objects.filter(agent="v").exists()


def test_a_done_trials_report_is_refused_to_a_member_who_never_held_it(grid, member, admin, project):
    other = UserFactory(username="mallory")
    Membership.objects.create(user=other, project=project, role=Role.MEMBER)
    trial = sweep_claim(actor=member, sweep=grid, agent="a").trial
    trial = sweep_trial_report(actor=member, trial=trial, exit_code=0, agent="a")
    assert (trial.state, trial.run.status) == (TrialState.DONE, RunStatus.FINISHED)
    with pytest.raises(Forbidden, match="This is not your run"):
        sweep_trial_report(actor=other, trial=trial, exit_code=1)
    assert sweep_trial_report(actor=admin, trial=trial, exit_code=1).run.status == RunStatus.FINISHED
