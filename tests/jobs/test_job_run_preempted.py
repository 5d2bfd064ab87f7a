"""A Job's Run that was preempting ends preempted when the Job fails, and its sweep trial is told
(docs/design/runs.md#states; docs/design/sweeps.md#requeue)."""

import pytest

from jobs import services
from runs.models import RunStatus
from runs.services import run_set_status
from tests.jobs.conftest import launch, run_to_end


@pytest.fixture
def job(creator, code_version, cpu):
    return launch(creator, code_version, cpu)


def test_a_preempting_run_whose_job_fails_ends_preempted_and_the_hook_hears_it(job, creator, ended):
    services.job_claim(job_id=job.pk, worker_host="gpu-1")
    run_set_status(actor=creator, run=job.run, status=RunStatus.RUNNING)
    run_set_status(actor=creator, run=job.run, status=RunStatus.PREEMPTING)
    services.job_finish(job_id=job.pk, exit_code=1)
    job.run.refresh_from_db()
    assert job.run.status == RunStatus.PREEMPTED and job.run.ended_at is not None
    assert ended == [(job.run.pk, RunStatus.PREEMPTED)]


@pytest.mark.parametrize("exit_code, final", [(0, RunStatus.FINISHED), (1, RunStatus.FAILED)])
def test_a_job_ending_its_run_tells_the_hook(job, ended, exit_code, final):
    run_to_end(job, exit_code=exit_code)
    assert ended == [(job.run.pk, final)]


def test_a_run_the_sdk_already_ended_preempted_is_not_reported_twice(job, creator, ended):
    services.job_claim(job_id=job.pk, worker_host="gpu-1")
    run_set_status(actor=creator, run=job.run, status=RunStatus.RUNNING)
    run_set_status(actor=creator, run=job.run, status=RunStatus.PREEMPTING)
    run_set_status(actor=creator, run=job.run, status=RunStatus.PREEMPTED)
    services.job_finish(job_id=job.pk, exit_code=1)
    assert ended == [(job.run.pk, RunStatus.PREEMPTED)]  # told once, by run_set_status; end_run changed nothing
