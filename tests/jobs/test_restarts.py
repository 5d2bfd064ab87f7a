"""A preempted Job resumes by itself (docs/design/resume.md#restarts): from its latest complete checkpoint, on the
same queue, after a doubling backoff, at most ``max_restarts`` times along its chain; it is also resumed by hand like
a failed one."""

from datetime import timedelta

import pytest
from django.db.models import Q
from django.utils import timezone

from checkpoints.models import CheckpointState
from jobs import services
from jobs.models import Job, JobKind, JobStatus
from jobs.services.restart import job_restart
from mado.errors import Conflict, ValidationFailed
from mado.models import AuditEvent, Dispatch
from runs.models import Membership, Role, RunStatus
from runs.services import run_set_status
from tests.jobs.conftest import checkpoint, launch, run_to_end


def preempt(job: Job, creator, *, by_worker: bool = True, exit_code: int = 143) -> Job:
    """Claim ``job``, let its code attach and (``by_worker`` False) mark its Run preempting, then end it."""
    services.job_claim(job_id=job.pk, worker_host="gpu-1")
    run_set_status(actor=creator, run=job.run, status=RunStatus.RUNNING)
    if not by_worker:
        run_set_status(actor=creator, run=job.run, status=RunStatus.PREEMPTING)
    return services.job_finish(job_id=job.pk, exit_code=exit_code, preempted=by_worker)


@pytest.mark.parametrize("by_worker", [True, False], ids=["worker-stopped-it", "code-marked-preempting"])
def test_a_preempted_job_restarts_from_its_latest_checkpoint_after_the_backoff(creator, code_version, cpu, by_worker):
    job = launch(creator, code_version, cpu, max_restarts=2)
    checkpoint(job.run, 10)
    latest = checkpoint(job.run, 20)
    checkpoint(job.run, 30, state=CheckpointState.PENDING)
    before = timezone.now()
    ended = preempt(job, creator, by_worker=by_worker)

    restart = ended.restart
    assert (ended.status, ended.run.status) == (JobStatus.PREEMPTED, RunStatus.PREEMPTED)
    assert ended.error.startswith("Preempted") or by_worker
    assert (restart.kind, restart.status, restart.restarts, restart.queue) == (JobKind.RESUME, "queued", 1, cpu)
    assert (restart.run.parent, restart.run.source_checkpoint) == (job.run, latest)
    assert restart.created_by == creator and restart.max_restarts == 2
    send_after = Dispatch.objects.get(task_id=restart.celery_task_id).send_after
    assert before + timedelta(seconds=29) < send_after < timezone.now() + timedelta(seconds=31)
    record = AuditEvent.objects.get(action="job.restart")
    assert record.actor_id is None and record.object_id == str(restart.pk)


def test_the_chain_stops_after_max_restarts_each_waiting_twice_as_long(creator, code_version, cpu, settings):
    settings.MADO_JOB_RESTART_BACKOFF_S, settings.MADO_JOB_RESTART_BACKOFF_MAX_S = 10, 15
    job = launch(creator, code_version, cpu, max_restarts=2)
    chain, delays = [job], []
    for step in (20, 40, 60):
        checkpoint(chain[-1].run, step)
        ended = preempt(chain[-1], creator)
        restart = Job.objects.filter(restart_of=ended).first()
        if restart:
            dispatch = Dispatch.objects.get(task_id=restart.celery_task_id)
            delays.append(round((dispatch.send_after - dispatch.created_at).total_seconds()))
            chain.append(restart)
    assert [j.restarts for j in chain] == [0, 1, 2] and delays == [10, 15]
    assert Job.objects.get(pk=chain[-1].pk).status == JobStatus.PREEMPTED and chain[2].run.source_checkpoint.step == 40
    assert Job.objects.count() == 3


def test_a_job_preempted_before_its_first_checkpoint_says_why_it_was_not_restarted(creator, code_version, cpu):
    ended = preempt(launch(creator, code_version, cpu, max_restarts=1), creator)
    assert ended.status == JobStatus.PREEMPTED and Job.objects.count() == 1
    assert "Not restarted: it has no complete checkpoint to resume from (MADO_JOB_RESTART_FROM_START is off)" in (
        ended.error
    )


def test_the_operator_may_let_it_start_again_from_the_start(creator, code_version, cpu, settings):
    settings.MADO_JOB_RESTART_FROM_START = True
    ended = preempt(launch(creator, code_version, cpu, max_restarts=1), creator)
    restart = ended.restart
    assert (restart.kind, restart.run.parent, restart.run.source_checkpoint, restart.restarts) == ("new", None, None, 1)
    assert restart.run.parameters == ended.run.parameters


def test_a_lost_worker_restarts_the_job_and_a_plain_failure_does_not(creator, code_version, cpu):
    lost = launch(creator, code_version, cpu, max_restarts=1)
    failed = launch(creator, code_version, cpu, max_restarts=1)
    for job in (lost, failed):
        checkpoint(job.run, 20)
        services.job_claim(job_id=job.pk, worker_host="gpu-1")
    services.job_finish(job_id=failed.pk, exit_code=1)
    Job.objects.filter(pk=lost.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert services.job_reap_stale() == 1
    lost.refresh_from_db()
    failed.refresh_from_db()
    assert lost.status == JobStatus.FAILED and lost.error.startswith("Worker lost") and lost.restart.restarts == 1
    assert failed.status == JobStatus.FAILED and not Job.objects.filter(restart_of=failed).exists()


def test_a_restart_is_made_once_however_often_it_is_asked(creator, code_version, cpu):
    job = launch(creator, code_version, cpu, max_restarts=3)
    checkpoint(job.run, 20)
    ended = preempt(job, creator)
    assert job_restart(job=ended) == ended.restart and Job.objects.filter(restart_of=ended).count() == 1


def test_a_preempted_run_is_resumed_by_hand_like_a_failed_one(creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    checkpoint(job.run, 20)
    ended = preempt(job, creator, by_worker=False, exit_code=1)
    resumed = services.job_resume_from_latest(actor=creator, job=ended)
    assert ended.status == JobStatus.PREEMPTED and resumed.run.source_checkpoint.step == 20


def test_a_launch_takes_the_projects_default_and_refuses_a_bad_count(creator, code_version, cpu, project):
    project.job_max_restarts = 3
    project.save()
    assert launch(creator, code_version, cpu).max_restarts == 3
    assert launch(creator, code_version, cpu, max_restarts=0).max_restarts == 0
    with pytest.raises(ValidationFailed, match="max_restarts must be an integer from 0 to 10"):
        launch(creator, code_version, cpu, max_restarts=11)


def test_the_job_page_and_the_api_show_the_restarts_and_link_both_ways(creator, code_version, cpu, login, api):
    job = launch(creator, code_version, cpu, max_restarts=2)
    checkpoint(job.run, 20)
    restart = preempt(job, creator).restart
    first, second = (login(creator).get(f"/jobs/{pk}/").content.decode() for pk in (job.pk, restart.pk))
    assert "0 of 2" in first and f"restarted as Job {restart.pk}" in first and "preempted" in first
    assert "1 of 2" in second and f"restart of preempted Job {job.pk}" in second
    data = api(creator).get(f"/api/v1/jobs/{job.pk}/").json()
    facts = (data["status"], data["max_restarts"], data["restarts"], data["restart_id"])
    assert facts == ("preempted", 2, 0, restart.pk)
    assert data["resume_refusal"] is None


def test_retries_and_restarts_share_one_chain_that_ends(creator, code_version, cpu):
    job = launch(creator, code_version, cpu, max_restarts=1, max_retries=1)
    chain = [job]
    for _ in range(6):
        current = Job.objects.get(pk=chain[-1].pk)
        checkpoint(current.run, 20)
        if current.kind == JobKind.RESUME:
            run_to_end(current, exit_code=1)
        else:
            preempt(current, creator)
        follow_up = Job.objects.filter(Q(restart_of=current) | Q(retry_of=current)).first()
        if follow_up is None:
            break
        chain.append(follow_up)
    assert [(j.kind, j.restarts, j.attempt) for j in chain] == [("new", 0, 1), ("resume", 1, 1), ("retry", 1, 2)]


def test_an_abort_wins_over_the_preemption_its_stop_signal_caused(creator, code_version, cpu):
    job = launch(creator, code_version, cpu, max_restarts=2)
    checkpoint(job.run, 20)
    services.job_claim(job_id=job.pk, worker_host="gpu-1")
    run_set_status(actor=creator, run=job.run, status=RunStatus.RUNNING)
    services.job_abort(actor=creator, job=job)
    run_set_status(actor=creator, run=job.run, status=RunStatus.PREEMPTING)  # the SDK's handler saw the SIGTERM
    ended = services.job_finish(job_id=job.pk, exit_code=0, preempted=True)
    assert (ended.status, ended.run.status, Job.objects.count()) == (JobStatus.ABORTED, RunStatus.ABORTED, 1)


@pytest.mark.parametrize("finished", [False, True], ids=["marked-preempting", "run-finished"])
def test_a_clean_exit_succeeds_and_is_not_restarted(creator, code_version, cpu, finished):
    job = launch(creator, code_version, cpu, max_restarts=2)
    checkpoint(job.run, 20)
    services.job_claim(job_id=job.pk, worker_host="gpu-1")
    run_set_status(actor=creator, run=job.run, status=RunStatus.RUNNING)
    run_set_status(actor=creator, run=job.run, status=RunStatus.FINISHED if finished else RunStatus.PREEMPTING)
    ended = services.job_finish(job_id=job.pk, exit_code=0, preempted=finished)  # the worker was stopping meanwhile
    assert (ended.status, ended.run.status, Job.objects.count()) == (JobStatus.SUCCEEDED, RunStatus.FINISHED, 1)


def test_a_lost_worker_that_cannot_be_restarted_is_retried(creator, code_version, cpu):
    job = launch(creator, code_version, cpu, max_restarts=1, max_retries=1)
    services.job_claim(job_id=job.pk, worker_host="gpu-1")
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    services.job_reap_stale()
    job.refresh_from_db()
    assert "Not restarted: it has no complete checkpoint" in job.error
    assert job.retries.get().kind == JobKind.RETRY


def test_a_restart_from_the_start_follows_the_resume_rules(creator, code_version, cpu, project, settings):
    settings.MADO_JOB_RESTART_FROM_START = True
    kept = preempt(launch(creator, code_version, cpu, max_restarts=1), creator)
    with pytest.raises(Conflict, match="already being resumed"):
        checkpoint(kept.run, 20)
        services.job_resume_from_latest(actor=creator, job=kept)  # its restart is queued
    demoted = launch(creator, code_version, cpu, max_restarts=1)
    services.job_claim(job_id=demoted.pk, worker_host="gpu-1")
    Membership.objects.filter(user=creator, project=project).update(role=Role.VIEWER)
    refused = services.job_finish(job_id=demoted.pk, exit_code=143, preempted=True)
    assert "Not restarted" in refused.error and not Job.objects.filter(restart_of=refused).exists()
