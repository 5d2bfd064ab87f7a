"""A Job that no Celery worker claims ends with its Run (docs/design/worker.md#subprocess): a Kubernetes JobSet runs the
code with the Run's token (``manage.py job_manifest``, docs/deploy.md) and nothing else watches the pods."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from jobs import services
from jobs.models import Job, JobStatus, RunToken
from jobs.services.lifecycle import ENDED_RUN_TOKEN_GRACE_S, job_fail_undelivered, job_waits_for_message
from runs.liveness import runs_reap_crashed
from runs.models import Run, RunStatus
from tests.jobs.conftest import launch
from tests.jobs.test_run_tokens import attach_body


@pytest.fixture
def queued(creator, code_version, cpu) -> Job:
    """A Job launched on a queue that no worker consumes (the JobSet runs it)."""
    return launch(creator, code_version, cpu)


@pytest.fixture
def pod(queued) -> APIClient:
    """The JobSet's training container: the Run's token from job_manifest's Secret, attached as the SDK does."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {services.run_token_issue(job=queued).key}")
    response = client.post("/api/v1/runs/", attach_body(queued.run), format="json")
    assert response.status_code == 200, response.content
    return client


def test_the_job_succeeds_when_the_code_finishes_its_run_and_the_token_is_revoked(pod, queued):
    run_id = queued.run_id
    assert Job.objects.get(pk=queued.pk).status == JobStatus.QUEUED  # running in the pods, not in a worker
    assert pod.patch(f"/api/v1/runs/{run_id}/", {"status": "finished"}, format="json").status_code == 200
    job = Job.objects.get(pk=queued.pk)
    run = Run.objects.get(pk=run_id)
    assert (job.status, job.error, job.exit_code) == (JobStatus.SUCCEEDED, "", None)
    assert job.started_at == run.started_at and job.ended_at >= run.started_at
    token = RunToken.objects.get(run_id=run_id)
    assert token.revoked_at == job.ended_at + timedelta(seconds=ENDED_RUN_TOKEN_GRACE_S)
    assert pod.get(f"/api/v1/runs/{run_id}/").status_code == 200  # the other nodes' last writes still get in
    RunToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now() - timedelta(seconds=1))  # grace over
    refused = pod.get(f"/api/v1/runs/{run_id}/")
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]


def test_the_job_fails_naming_the_status_when_the_code_fails_its_run(pod, queued):
    assert pod.patch(f"/api/v1/runs/{queued.run_id}/", {"status": "failed"}, format="json").status_code == 200
    job = Job.objects.get(pk=queued.pk)
    assert job.status == JobStatus.FAILED and job.error.startswith("Its Run ended failed without a worker")
    # no automatic retry from scratch (docs/design/resume.md#retry)
    assert Job.objects.filter(run_id=queued.run_id).count() == 1


def test_the_job_fails_when_the_pods_fall_silent_and_the_reaper_ends_the_run_crashed(pod, queued, settings):
    fencing = Run.objects.get(pk=queued.run_id).lease_token
    beat = pod.post(f"/api/v1/runs/{queued.run_id}/heartbeat/", HTTP_MADO_FENCING_TOKEN=str(fencing))
    assert beat.status_code == 200, beat.content  # the SDK's heartbeat thread, then the pods are gone
    later = timezone.now() + timedelta(seconds=settings.MMT_CRASH_TIMEOUT + 5)
    assert runs_reap_crashed(now=later) == 1
    job = Job.objects.get(pk=queued.pk)
    assert Run.objects.get(pk=queued.run_id).status == RunStatus.CRASHED
    assert job.status == JobStatus.FAILED and "Its Run ended crashed" in job.error


def test_a_job_a_worker_claimed_is_left_to_its_worker_when_the_code_ends_the_run(creator, code_version, cpu):
    job = services.job_claim(job_id=launch(creator, code_version, cpu).pk, worker_host="gpu-1")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {services.run_token_issue(job=job).key}")
    assert client.post("/api/v1/runs/", attach_body(job.run), format="json").status_code == 200
    assert client.patch(f"/api/v1/runs/{job.run_id}/", {"status": "finished"}, format="json").status_code == 200
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING  # the worker records the exit code
    finished = services.job_finish(job_id=job.pk, exit_code=0)
    assert (finished.status, finished.exit_code) == (JobStatus.SUCCEEDED, 0)


def test_aborting_a_queued_job_still_ends_it_aborted_with_who_asked(creator, queued):
    aborted = services.job_abort(actor=creator, job=queued)
    assert aborted.status == JobStatus.ABORTED and aborted.error == "Aborted by carol-creator before it started."


def test_the_outbox_stops_waiting_once_the_pods_attached_the_run_and_never_fails_a_training_job(pod, queued):
    assert not job_waits_for_message([queued.pk])  # a worker's claim is not coming: the code runs elsewhere
    job_fail_undelivered([queued.pk], "No worker took it for 48 h.")
    assert Job.objects.get(pk=queued.pk).status == JobStatus.QUEUED
    assert Run.objects.get(pk=queued.run_id).status == RunStatus.RUNNING


def test_a_job_waiting_for_a_worker_is_still_awaited_and_failed_when_none_comes(creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    assert job_waits_for_message([job.pk])
    job_fail_undelivered([job.pk], "No worker took it.")
    failed = Job.objects.get(pk=job.pk)
    assert failed.status == JobStatus.FAILED and failed.error == "The Job never started. No worker took it."
