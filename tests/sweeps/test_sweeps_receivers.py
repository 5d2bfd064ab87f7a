"""A trial follows its Run through the events runs sends (``runs.hooks.run_started`` / ``run_ended``), which the
sweeps app connects in ``SweepsConfig.ready``; runs itself imports no sweeps module and works without them
(docs/design/sweeps.md#requeue)."""

import pytest
from django.db import transaction

from runs import hooks
from runs.models import RunStatus
from runs.resume import run_start
from runs.services import run_set_status
from sweeps import receivers
from sweeps.models import TrialState
from sweeps.services import sweep_claim
from tests.sweeps.sweep_helpers import make_sweep, start_program

pytestmark = pytest.mark.django_db

CONNECTED = [
    (hooks.run_started, receivers.trial_of_started_run, "sweeps.trial_of_started_run"),
    (hooks.run_ended, receivers.trial_of_ended_run, "sweeps.trial_of_ended_run"),
]


@pytest.fixture
def grid(project, member):
    return make_sweep(actor=member, project=project)


@pytest.fixture
def without_sweeps_receivers():
    """The sweeps app's receivers disconnected for the test, connected again after it."""
    for signal, _receiver, uid in CONNECTED:
        assert signal.disconnect(dispatch_uid=uid)
    yield
    receivers.connect()


def state_of(trial):
    trial.refresh_from_db()
    return trial.state, trial.requeue_count


@pytest.mark.parametrize(("signal", "receiver", "uid"), CONNECTED)
def test_the_app_connects_its_receivers_once(signal, receiver, uid):
    receivers.connect()  # connecting again (a second ready()) adds nothing: dispatch_uid
    assert [ref() for (key, _), ref, *_ in signal.receivers if key == uid] == [receiver]


def test_a_trial_runs_when_its_run_starts_and_is_queued_again_when_it_ends_preempted(grid, member, admin):
    trial = sweep_claim(actor=member, sweep=grid, agent="a:1").trial
    assert state_of(trial) == (TrialState.LEASED, 0)
    run = start_program(actor=member, trial=trial)  # attach: pending → running
    assert state_of(trial) == (TrialState.RUNNING, 0) and trial.lease_expires_at is None
    run_set_status(actor=member, run=run, status=RunStatus.PREEMPTING)
    assert state_of(trial) == (TrialState.RUNNING, 0)
    run_set_status(actor=member, run=run, status=RunStatus.PREEMPTED)
    assert state_of(trial) == (TrialState.QUEUED, 1) and trial.agent == ""
    claim = sweep_claim(actor=admin, sweep=grid, agent="b:1")
    assert claim.trial.pk == trial.pk
    resumed = start_program(actor=admin, trial=claim.trial, pid=99)  # resume: preempted → running
    assert (resumed.pk, resumed.resume_count) == (run.pk, 1)
    assert state_of(trial) == (TrialState.RUNNING, 1)
    run_set_status(actor=admin, run=resumed, status=RunStatus.FINISHED)
    assert state_of(trial) == (TrialState.DONE, 1)


def test_the_trial_moves_in_the_transaction_that_started_its_run(grid, member):
    trial = sweep_claim(actor=member, sweep=grid, agent="a:1").trial
    with pytest.raises(RuntimeError), transaction.atomic():
        start_program(actor=member, trial=trial)
        assert state_of(trial)[0] == TrialState.RUNNING
        raise RuntimeError("rolled back")
    trial.run.refresh_from_db()
    assert trial.run.status == RunStatus.PENDING and state_of(trial)[0] == TrialState.LEASED


def test_runs_starts_and_ends_runs_without_the_sweeps_receivers(grid, member, run, creator, without_sweeps_receivers):
    trial = sweep_claim(actor=member, sweep=grid, agent="a:1").trial
    started = start_program(actor=member, trial=trial)
    assert started.status == RunStatus.RUNNING and state_of(trial) == (TrialState.LEASED, 0)
    assert run_set_status(actor=member, run=started, status=RunStatus.PREEMPTED).status == RunStatus.PREEMPTED
    assert state_of(trial) == (TrialState.LEASED, 0)  # nobody told the trial
    plain = run_start(actor=creator, project=run.project, external_id="plain-1", resume="allow", host="h", pid=1).run
    assert run_set_status(actor=creator, run=plain, status=RunStatus.FINISHED).status == RunStatus.FINISHED
