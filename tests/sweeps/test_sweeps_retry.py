"""Retrying a failed sweep trial (docs/design/sweeps.md#requeue): ``POST sweeps/{id}/trials/{n}/retry/`` and the service
behind it.

A failed trial gets a fresh Run with its parameters, queued for the next agent; the failed Run stays unchanged
as history; a second retry (a double click, a CLI rerun) is refused with what the trial is now.
"""

import pytest

from runs.models import Run, RunStatus
from runs.services import run_set_status
from sweeps.models import SweepTrial, TrialState
from sweeps.services import sweep_claim, sweep_trial_report, sweep_trial_retry
from tests.sweeps.sweep_helpers import log_metric, make_sweep, start_program

pytestmark = pytest.mark.django_db


@pytest.fixture
def failed(project, member):
    """Trial 1 of a grid sweep whose program started its Run, logged a metric and exited 1."""
    sweep = make_sweep(actor=member, project=project)
    trial = sweep_claim(actor=member, sweep=sweep, agent="gpu-1:7").trial
    run = start_program(actor=member, trial=trial)
    log_metric(actor=member, run=run, key="val_loss", values=[0.9, 0.8])
    return sweep_trial_report(actor=member, trial=trial, exit_code=1, agent="gpu-1:7")


def retry(client, trial):
    return client.post(f"/api/v1/sweeps/{trial.sweep_id}/trials/{trial.number}/retry/", format="json")


def test_a_failed_trial_is_retried_with_a_fresh_run_and_the_failed_run_stays_as_history(api, failed, admin):
    old = failed.run
    response = retry(api(admin), failed)
    assert response.status_code == 200, response.json()
    body = response.json()
    trial = SweepTrial.objects.select_related("run").get(pk=failed.pk)
    assert (body["number"], body["state"], body["retry_count"], body["run_status"]) == (1, "queued", 1, "pending")
    assert body["external_id"] == trial.run.external_id != old.external_id
    assert trial.run.parameters == failed.parameters and trial.run.name == "digits-1-retry1"
    assert (trial.agent, trial.claimed_by_id, trial.requeue_count) == ("", None, 0)
    assert list(trial.earlier_runs.all()) == [old]
    old_now = Run.objects.get(pk=old.pk)  # untouched: status, metrics, name
    assert (old_now.status, old_now.name, old_now.metric_points.count()) == (RunStatus.FAILED, old.name, 2)


def test_the_next_claim_hands_out_the_retried_trial_to_start_fresh(failed, member):
    retried = sweep_trial_retry(actor=member, trial=failed)
    claim = sweep_claim(actor=member, sweep=failed.sweep, agent="gpu-2:9")
    assert claim.trial.pk == failed.pk and claim.trial.run_id == retried.run_id
    assert claim.latest_checkpoint is None  # a fresh attempt: nothing of the failed Run is resumed
    assert claim.reason == "trial 1 was retried: a fresh run with the same parameters"
    run = start_program(actor=member, trial=claim.trial)
    run_set_status(actor=member, run=run, status=RunStatus.FINISHED)
    trial = SweepTrial.objects.select_related("run").get(pk=failed.pk)
    assert (trial.state, trial.run.status) == (TrialState.DONE, RunStatus.FINISHED)


def test_a_second_retry_is_refused_naming_the_queued_run_and_queues_nothing_more(api, failed, member):
    assert retry(api(member), failed).status_code == 200
    runs_before = Run.objects.count()
    again = retry(api(member), failed)
    assert again.status_code == 409
    new_run = SweepTrial.objects.get(pk=failed.pk).run
    assert again.json()["detail"] == (
        f"trial 1 was already retried: its new run {new_run.external_id} is waiting for an agent"
    )
    assert again.json()["field"] == "trial"
    assert Run.objects.count() == runs_before
    assert SweepTrial.objects.get(pk=failed.pk).retry_count == 1


@pytest.mark.parametrize("end, status", [(RunStatus.CRASHED, 200), (RunStatus.ABORTED, 200), (RunStatus.FINISHED, 409)])
def test_crashed_and_aborted_trials_may_be_retried_a_finished_one_not(api, project, member, end, status):
    sweep = make_sweep(actor=member, project=project)
    trial = sweep_claim(actor=member, sweep=sweep, agent="a").trial
    run_set_status(actor=member, run=start_program(actor=member, trial=trial), status=end)
    response = retry(api(member), trial)
    assert response.status_code == status
    if status == 409:
        assert response.json()["detail"] == (
            "trial 1 ended finished: only a failed, crashed or aborted trial can be retried"
        )


def test_a_trial_still_claimed_is_not_retried(api, project, member):
    sweep = make_sweep(actor=member, project=project)
    trial = sweep_claim(actor=member, sweep=sweep, agent="a").trial
    response = retry(api(member), trial)
    assert response.status_code == 409
    assert "only a failed trial can be retried" in response.json()["detail"]
    assert SweepTrial.objects.get(pk=trial.pk).state == TrialState.LEASED


def test_viewers_are_refused_outsiders_see_no_sweep_and_a_missing_trial_is_404(api, failed, viewer, outsider, member):
    assert retry(api(viewer), failed).status_code == 403
    assert retry(api(outsider), failed).status_code == 404
    missing = api(member).post(f"/api/v1/sweeps/{failed.sweep_id}/trials/99/retry/", format="json")
    assert missing.status_code == 404 and missing.json()["field"] == "number"
    assert SweepTrial.objects.get(pk=failed.pk).retry_count == 0
