"""Launch, dispatch, claim, heartbeat, logs, finish, retry, abort, reaper and tokens (docs/design/resume.md#retry;
docs/design/worker.md#subprocess)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import services
from jobs.models import Job, JobKind, JobStatus, RunLogChunk, RunToken
from jobs.tasks import reap_stale_jobs
from mado.errors import Conflict, Forbidden, NotFound, ValidationFailed
from mado.periodic import beat_schedule
from runs.models import Run, RunKind, RunStatus
from tests.jobs.conftest import checkpoint, launch, run_to_end

# --- launch and dispatch --------------------------------------------------------------


def test_launch_creates_a_pending_run_and_a_queued_job(creator, code_version, cpu, dataset_versions):
    job = launch(
        creator, code_version, cpu, dataset_version_ids=[dataset_versions[0].pk], kind_of_run=RunKind.FINE_TUNING
    )
    run = job.run
    assert (job.kind, job.status, job.attempt, job.max_retries, job.queue) == (JobKind.NEW, JobStatus.QUEUED, 1, 0, cpu)
    assert (run.status, run.kind, run.code_version, run.created_by) == (
        RunStatus.PENDING,
        RunKind.FINE_TUNING,
        code_version,
        creator,
    )
    assert run.started_at is None and run.parameters == {"lr": 0.1}
    assert list(run.input_dataset_versions.all()) == [dataset_versions[0]]
    assert job.celery_task_id


def test_launch_is_sent_on_commit_to_the_jobs_queue_with_its_stored_task_id(
    creator, code_version, gpu, celery_calls, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job = launch(creator, code_version, gpu)
    assert celery_calls.sent == [], "nothing is sent before the commit"
    for callback in callbacks:
        callback()
    assert celery_calls.sent == [
        {"name": "worker.tasks.run_job", "args": [job.pk], "queue": "gpu-a100", "task_id": job.celery_task_id}
    ]
    job.refresh_from_db()
    assert job.celery_task_id == celery_calls.sent[0]["task_id"]


def test_a_viewer_cannot_launch(viewer, code_version, cpu):
    with pytest.raises(Forbidden, match="viewer"):
        launch(viewer, code_version, cpu)
    assert not Job.objects.exists()


@pytest.mark.parametrize("value", [-1, 11, "2", True])
def test_launch_refuses_a_bad_max_retries(creator, code_version, cpu, value):
    with pytest.raises(ValidationFailed) as caught:
        launch(creator, code_version, cpu, max_retries=value)
    assert caught.value.field == "max_retries"
    assert not Run.objects.exists()


def test_launch_refuses_a_disabled_queue(creator, code_version, gpu):
    gpu.enabled = False
    gpu.save()
    with pytest.raises(ValidationFailed) as caught:
        launch(creator, code_version, gpu)
    assert caught.value.field == "queue"


def test_launch_refuses_dataset_versions_of_another_project(creator, code_version, cpu, other_project):
    from tests.factories import DatasetVersionFactory

    foreign = DatasetVersionFactory(dataset__project=other_project)
    with pytest.raises(ValidationFailed) as caught:
        launch(creator, code_version, cpu, dataset_version_ids=[foreign.pk])
    assert caught.value.field == "input_dataset_version_ids"
    assert not Job.objects.exists()


# --- claim, heartbeat, logs -----------------------------------------------------------------


def test_claim_moves_queued_to_running_once(creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    claimed = services.job_claim(job_id=job.pk, worker_host="gpu-1")
    assert (claimed.status, claimed.worker_host) == (JobStatus.RUNNING, "gpu-1")
    assert claimed.started_at and claimed.heartbeat_at
    assert claimed.run.status == RunStatus.PENDING, "the Run starts when the SDK attaches"
    assert services.job_claim(job_id=job.pk, worker_host="gpu-2") is None
    assert services.job_claim(job_id=999999, worker_host="gpu-2") is None


def test_heartbeat_is_true_while_running_and_false_after_an_abort_or_the_end(creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    assert services.job_heartbeat(job_id=job.pk) is False, "not running yet"
    services.job_claim(job_id=job.pk, worker_host="w")
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=60))
    assert services.job_heartbeat(job_id=job.pk) is True
    job.refresh_from_db()
    assert timezone.now() - job.heartbeat_at < timedelta(seconds=5)
    services.job_abort(actor=creator, job=job)
    assert services.job_heartbeat(job_id=job.pk) is False
    services.job_finish(job_id=job.pk, exit_code=-15, aborted=True)
    assert services.job_heartbeat(job_id=job.pk) is False


def test_log_chunks_are_numbered_and_capped(creator, code_version, cpu, settings):
    settings.MADO_JOB_LOG_MAX_BYTES = 20
    job = launch(creator, code_version, cpu)
    services.job_append_log(job_id=job.pk, text="step 10\n")
    services.job_append_log(job_id=job.pk, text="")
    services.job_append_log(job_id=job.pk, text="nul\x00 and é and more text\n")
    assert services.job_append_log(job_id=job.pk, text="dropped\n") is None
    chunks = list(RunLogChunk.objects.filter(run=job.run).values_list("seq", "text"))
    assert chunks == [(1, "step 10\n"), (2, "nul\ufffd and \n[log truncated]\n")], "é cut in half is dropped"
    job.refresh_from_db()
    assert job.log_truncated and job.log_bytes <= 20


def test_append_log_of_an_unknown_job_is_not_found(db):
    with pytest.raises(NotFound):
        services.job_append_log(job_id=12345, text="x")


# --- finish and retry -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "exit_code, aborted, error, job_status, run_status",
    [
        (0, False, "", JobStatus.SUCCEEDED, RunStatus.FINISHED),
        (1, False, "", JobStatus.FAILED, RunStatus.FAILED),
        (None, False, "Checkpoint 7 sha256 mismatch: model.pt", JobStatus.FAILED, RunStatus.FAILED),
        (-15, True, "", JobStatus.ABORTED, RunStatus.ABORTED),
    ],
)
def test_finish_keeps_job_and_run_consistent(
    creator, code_version, cpu, exit_code, aborted, error, job_status, run_status
):
    job = run_to_end(launch(creator, code_version, cpu), exit_code=exit_code, aborted=aborted, error=error)
    assert (job.status, job.exit_code, job.run.status) == (job_status, exit_code, run_status)
    assert job.ended_at and job.run.ended_at
    if error:
        assert job.error == error
    elif job_status == JobStatus.FAILED:
        assert job.error == "The code exited with code 1."


def test_finish_of_a_run_the_sdk_already_ended_takes_the_exit_codes_outcome(creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="w")
    ended = timezone.now() - timedelta(seconds=30)
    Run.objects.filter(pk=job.run_id).update(status=RunStatus.FINISHED, ended_at=ended)
    job = services.job_finish(job_id=job.pk, exit_code=3)
    job.run.refresh_from_db()
    assert (job.run.status, job.run.ended_at) == (RunStatus.FAILED, ended)


def test_finish_is_idempotent(creator, code_version, cpu):
    job = run_to_end(launch(creator, code_version, cpu), exit_code=0)
    again = services.job_finish(job_id=job.pk, exit_code=1, error="late")
    assert (again.status, again.exit_code, again.error) == (JobStatus.SUCCEEDED, 0, "")


def test_a_failed_job_with_retries_left_starts_again_from_scratch(
    creator, code_version, cpu, celery_calls, django_capture_on_commit_callbacks
):
    first = launch(creator, code_version, cpu, max_retries=2)
    with django_capture_on_commit_callbacks(execute=True):
        run_to_end(first, exit_code=1)
    second = Job.objects.get(retry_of=first)
    assert (second.kind, second.attempt, second.max_retries, second.status) == (JobKind.RETRY, 2, 2, JobStatus.QUEUED)
    assert second.run != first.run and second.run.status == RunStatus.PENDING
    assert second.run.parent is None and second.run.source_checkpoint is None, "never from a checkpoint"
    assert second.resumed_from is None
    assert second.run.parameters == first.run.parameters and second.code_version == first.code_version
    assert [call["args"] for call in celery_calls.sent] == [[second.pk]]
    third = Job.objects.get(retry_of=run_to_end(second, exit_code=1))
    assert third.attempt == 3
    run_to_end(third, exit_code=1)
    assert Job.objects.count() == 3, "max_retries=2: three attempts in all"


def test_a_retry_of_a_resumed_job_starts_from_scratch(failed_job, creator):
    ckpt = checkpoint(failed_job.run, 20)
    resumed = services.run_resume_from_checkpoint(actor=creator, checkpoint=ckpt)
    Job.objects.filter(pk=resumed.pk).update(max_retries=1)
    retry = Job.objects.get(retry_of=run_to_end(resumed, exit_code=1))
    assert retry.kind == JobKind.RETRY and retry.run.source_checkpoint is None and retry.run.parent is None


def test_success_and_abort_are_not_retried(creator, code_version, cpu):
    run_to_end(launch(creator, code_version, cpu, max_retries=3), exit_code=0)
    run_to_end(launch(creator, code_version, cpu, max_retries=3), exit_code=-15, aborted=True)
    assert not Job.objects.filter(kind=JobKind.RETRY).exists()


def test_retry_from_scratch_is_idempotent_and_refuses_without_attempts_left(creator, code_version, cpu):
    job = launch(creator, code_version, cpu, max_retries=1)
    run_to_end(job, exit_code=1)
    retry = Job.objects.get(retry_of=job)
    assert services.job_retry_from_scratch(job=job) == retry
    run_to_end(retry, exit_code=1)
    with pytest.raises(Conflict, match="used its 1 automatic retries"):
        services.job_retry_from_scratch(job=retry)
    with pytest.raises(Conflict, match="only a failed Job"):
        services.job_retry_from_scratch(job=launch(creator, code_version, cpu, max_retries=1))


def test_a_disabled_queue_stops_the_retry_and_says_so(creator, code_version, gpu):
    job = launch(creator, code_version, gpu, max_retries=1)
    services.job_claim(job_id=job.pk, worker_host="w")
    gpu.enabled = False
    gpu.save()
    job = services.job_finish(job_id=job.pk, exit_code=2)
    assert job.status == JobStatus.FAILED and "Not retried: queue 'gpu-a100' is disabled" in job.error
    assert not Job.objects.filter(retry_of=job).exists()


# --- abort ----------------------------------------------------------------------------------


def test_abort_of_a_queued_job_ends_it_at_once_and_revokes_the_task(
    creator, code_version, cpu, celery_calls, django_capture_on_commit_callbacks
):
    job = launch(creator, code_version, cpu)
    with django_capture_on_commit_callbacks(execute=True):
        aborted = services.job_abort(actor=creator, job=job)
    assert (aborted.status, aborted.run.status) == (JobStatus.ABORTED, RunStatus.ABORTED)
    assert aborted.abort_requested_at and aborted.ended_at and aborted.run.ended_at
    assert "Aborted by carol-creator" in aborted.error
    assert celery_calls.revoked == [job.celery_task_id]
    assert services.job_claim(job_id=job.pk, worker_host="w") is None, "a late message cannot start it"


def test_abort_of_a_running_job_is_recorded_and_the_worker_ends_it(
    admin, creator, code_version, cpu, celery_calls, django_capture_on_commit_callbacks
):
    job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="w")
    with django_capture_on_commit_callbacks(execute=True):
        requested = services.job_abort(actor=admin, job=job)
    assert requested.status == JobStatus.RUNNING and requested.abort_requested_at
    assert celery_calls.revoked == [job.celery_task_id]
    assert services.job_heartbeat(job_id=job.pk) is False
    ended = services.job_finish(job_id=job.pk, exit_code=-15)
    assert (ended.status, ended.run.status) == (JobStatus.ABORTED, RunStatus.ABORTED)


def test_abort_permissions_and_states(creator, member, viewer, code_version, cpu):
    job = launch(creator, code_version, cpu)
    with pytest.raises(Forbidden, match="not your run"):
        services.job_abort(actor=member, job=job)
    with pytest.raises(Forbidden, match="viewer"):
        services.job_abort(actor=viewer, job=job)
    services.job_abort(actor=creator, job=job)
    assert services.job_abort(actor=creator, job=job).status == JobStatus.ABORTED
    done = run_to_end(launch(creator, code_version, cpu), exit_code=0)
    with pytest.raises(Conflict, match="already ended succeeded"):
        services.job_abort(actor=creator, job=done)


# --- reaper -----------------------------------------------------------------------------------


def test_the_reaper_fails_jobs_whose_worker_went_silent(creator, code_version, cpu, settings):
    settings.MADO_JOB_HEARTBEAT_TIMEOUT = 120
    stale, fresh, queued = (launch(creator, code_version, cpu) for _ in range(3))
    for job in (stale, fresh):
        services.job_claim(job_id=job.pk, worker_host="gpu-7")
    now = timezone.now()
    Job.objects.filter(pk=stale.pk).update(heartbeat_at=now - timedelta(seconds=121))
    Job.objects.filter(pk=fresh.pk).update(heartbeat_at=now - timedelta(seconds=60))
    Job.objects.filter(pk=queued.pk).update(created_at=now - timedelta(days=2))
    assert services.job_reap_stale(now=now) == 1
    stale.refresh_from_db()
    assert (stale.status, stale.run.status) == (JobStatus.FAILED, RunStatus.FAILED)
    assert stale.error.startswith("Worker lost: no heartbeat from gpu-7 since")
    assert Job.objects.get(pk=fresh.pk).status == JobStatus.RUNNING
    assert Job.objects.get(pk=queued.pk).status == JobStatus.QUEUED
    assert services.job_reap_stale(now=now) == 0


def test_a_reaped_job_with_an_abort_pending_ends_aborted_and_a_late_worker_changes_nothing(creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="w")
    services.job_abort(actor=creator, job=job)
    assert services.job_reap_stale(now=timezone.now() + timedelta(hours=1)) == 1
    job.refresh_from_db()
    assert (job.status, job.run.status) == (JobStatus.ABORTED, RunStatus.ABORTED)
    assert services.job_finish(job_id=job.pk, exit_code=0).status == JobStatus.ABORTED


def test_the_reaper_retries_a_lost_job_with_attempts_left(creator, code_version, cpu):
    job = launch(creator, code_version, cpu, max_retries=1)
    services.job_claim(job_id=job.pk, worker_host="w")
    services.job_reap_stale(now=timezone.now() + timedelta(hours=1))
    assert Job.objects.get(retry_of=job).attempt == 2


def test_the_beat_task_runs_the_reaper(creator, code_version, cpu, settings):
    job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="w")
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert reap_stale_jobs() == 1
    schedule = beat_schedule()["reap-stale-jobs"]
    assert (schedule["task"], schedule["schedule"]) == ("jobs.tasks.reap_stale_jobs", 60.0)


# --- run tokens -------------------------------------------------------------------------------


def test_a_run_token_is_issued_once_per_run_and_revoked_when_the_job_ends(creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="w")
    token = services.run_token_issue(job=job)
    assert (token.run, token.user, len(token.key)) == (job.run, creator, 49)
    again = services.run_token_issue(job=job)
    assert (again, again.key) == (token, token.key), "a retried worker gets the same key"
    services.job_finish(job_id=job.pk, exit_code=0)
    token.refresh_from_db()
    assert token.revoked_at is not None
    with pytest.raises(Conflict):
        services.run_token_issue(job=job)
    assert RunToken.objects.count() == 1


def test_in_eager_mode_the_registered_task_runs_in_process(
    creator, code_version, cpu, monkeypatch, celery_calls, django_capture_on_commit_callbacks
):
    from celery import current_app

    from worker.tasks import run_job as task

    ran = []
    monkeypatch.setitem(current_app.conf, "task_always_eager", True)
    monkeypatch.setattr(task, "apply_async", lambda args, **options: ran.append((args, options)))
    with django_capture_on_commit_callbacks(execute=True):
        job = launch(creator, code_version, cpu)
    assert ran == [([job.pk], {"queue": "cpu", "task_id": job.celery_task_id})] and celery_calls.sent == []
