"""The jobs app writes what runs needs to know onto the Run (docs/design/house.md#arrows): ran as a Job, its Job
ended, its worker vouches for it until a time. runs reads those facts and asks no other app, so a rule holds with
no receiver connected to any of runs' signals."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.services import job_claim, job_finish, job_heartbeat
from mado.errors import Forbidden
from runs import hooks
from runs.liveness import runs_reap_crashed
from runs.models import Run, RunStatus
from runs.resume import run_start
from tests.jobs.conftest import launch, run_to_end


@pytest.fixture
def no_receivers():
    """Every receiver of runs' signals (``run_started``, ``run_ended``) disconnected for the test, then restored."""
    signals = (hooks.run_started, hooks.run_ended)
    saved = [signal.receivers[:] for signal in signals]
    for signal in signals:
        signal.receivers.clear()
        signal.sender_receivers_cache.clear()
    yield
    for signal, receivers in zip(signals, saved):
        signal.receivers[:] = receivers
        signal.sender_receivers_cache.clear()


def test_a_job_marks_its_run_as_a_jobs_and_its_end_marks_the_job_ended(creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    run = Run.objects.get(pk=job.run_id)
    assert (run.ran_as_job, run.job_ended) == (True, False)
    run_to_end(job, exit_code=0)
    run.refresh_from_db()
    assert (run.ran_as_job, run.job_ended, run.job_alive_until) == (True, True, None)


def test_a_run_started_by_the_sdk_alone_is_no_jobs(creator, project):
    started = run_start(actor=creator, project=project, external_id="sdk-only", resume="allow")
    run = Run.objects.get(pk=started.run.pk)
    assert (run.ran_as_job, run.job_ended, run.job_alive_until) == (False, False, None)


def test_members_cannot_reopen_a_jobs_run_by_id_even_with_no_receiver_connected(
    no_receivers, project, creator, member, code_version, cpu
):
    project.members_may_resume = True
    project.save()
    run = run_to_end(launch(creator, code_version, cpu), exit_code=1).run
    with pytest.raises(Forbidden):
        run_start(actor=member, project=project, external_id=run.external_id, resume="must")
    assert Run.objects.get(pk=run.pk).status == RunStatus.FAILED


def test_the_reaper_spares_a_silent_run_while_its_jobs_worker_beats_and_not_after(
    no_receivers, project, creator, code_version, cpu, settings
):
    settings.MMT_CRASH_TIMEOUT, settings.MADO_JOB_HEARTBEAT_TIMEOUT = 30, 120
    job = launch(creator, code_version, cpu)
    job_claim(job_id=job.pk, worker_host="gpu-1")
    run_start(actor=creator, project=project, external_id=job.run.external_id, resume="allow", host="gpu-1", pid=1)
    assert job_heartbeat(job_id=job.pk)
    run = Run.objects.get(pk=job.run_id)
    assert run.job_alive_until >= timezone.now() + timedelta(seconds=115)
    assert runs_reap_crashed(now=run.heartbeat_at + timedelta(seconds=31)) == 0  # its SDK is silent, its worker not
    assert runs_reap_crashed(now=run.job_alive_until + timedelta(seconds=1)) == 1
    assert Run.objects.get(pk=job.run_id).status == RunStatus.CRASHED
    job_finish(job_id=job.pk, exit_code=1)
    assert Run.objects.get(pk=job.run_id).job_alive_until is None
