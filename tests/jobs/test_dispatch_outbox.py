"""Dispatch through the outbox (docs/design/worker.md#subprocess): a broker outage leaves Jobs queued and waiting, never
failed or lost."""

from datetime import timedelta

import pytest
from celery import current_app
from django.utils import timezone

from jobs import services
from jobs.models import Job, JobStatus
from mado.models import Dispatch
from mado.outbox import dispatch_reap_overdue
from mado.tasks import flush_dispatches, reap_undelivered
from runs.models import RunStatus
from tests.jobs.conftest import launch


@pytest.fixture
def broker(monkeypatch, celery_calls):
    """``broker.down = True`` makes every send raise like an unreachable Redis; sends that succeed are recorded."""
    state = type("Broker", (), {"down": False})()
    recorded = current_app.send_task

    def send_task(name, args=None, **options):
        if state.down:
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        return recorded(name, args=args, **options)

    monkeypatch.setattr(current_app, "send_task", send_task)
    return state


def test_a_launch_while_the_broker_is_down_answers_queued_and_waiting(
    client_as, login, creator, code_version, cpu, broker, celery_calls, django_capture_on_commit_callbacks
):
    broker.down = True
    with django_capture_on_commit_callbacks(execute=True):
        response = client_as("creator").post("/api/v1/jobs/", {"code_version_id": code_version.pk}, format="json")
    assert response.status_code == 201, response.content
    assert (response.json()["status"], response.json()["waiting_for_queue"]) == ("queued", True)
    job = Job.objects.get(pk=response.json()["id"])
    page = login(creator).get(f"/jobs/{job.pk}/")
    assert "Waiting for the queue" in page.content.decode()
    assert Dispatch.objects.get(task_id=job.celery_task_id).last_error.startswith("ConnectionError")

    assert flush_dispatches() == 0, "still down: nothing sent, nothing failed"
    broker.down = False
    assert flush_dispatches() == 1
    assert celery_calls.sent == [
        {"name": "worker.tasks.run_job", "args": [job.pk], "queue": "cpu", "task_id": job.celery_task_id}
    ]
    again = client_as("creator").get(f"/api/v1/jobs/{job.pk}/").json()
    assert (again["status"], again["waiting_for_queue"]) == ("queued", False)
    assert "Waiting for the queue" not in login(creator).get(f"/jobs/{job.pk}/").content.decode()
    assert flush_dispatches() == 0, "a message the broker took is not sent again"


def test_a_launch_rolled_back_leaves_no_message(
    creator, code_version, cpu, celery_calls, django_capture_on_commit_callbacks
):
    from django.db import transaction

    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(RuntimeError), transaction.atomic():
            launch(creator, code_version, cpu)
            raise RuntimeError("the request failed after the launch")
    assert not Job.objects.exists() and not Dispatch.objects.exists() and celery_calls.sent == []


def test_a_job_aborted_while_waiting_is_never_sent(
    creator, code_version, cpu, broker, celery_calls, django_capture_on_commit_callbacks
):
    broker.down = True
    with django_capture_on_commit_callbacks(execute=True):
        job = launch(creator, code_version, cpu)
        services.job_abort(actor=creator, job=job)
    broker.down = False
    assert flush_dispatches() == 0 and celery_calls.sent == []
    assert Dispatch.objects.get(task_id=job.celery_task_id).done_at is not None


def test_an_unclaimed_job_is_sent_once_more_then_failed_with_the_reason(
    creator, code_version, cpu, celery_calls, settings, django_capture_on_commit_callbacks
):
    settings.MADO_DISPATCH_TIMEOUT = 600
    with django_capture_on_commit_callbacks(execute=True):
        job = launch(creator, code_version, cpu, max_retries=1)
    assert len(celery_calls.sent) == 1
    assert reap_undelivered() == 0, "within the timeout nothing happens"
    later = timezone.now() + timedelta(seconds=601)
    assert dispatch_reap_overdue(now=later) == 1
    assert [c["task_id"] for c in celery_calls.sent] == [job.celery_task_id] * 2, "sent once more, same task id"
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED

    with django_capture_on_commit_callbacks(execute=True):
        assert dispatch_reap_overdue(now=later + timedelta(seconds=601)) == 1
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.run.status == RunStatus.FAILED
    assert job.error.startswith("The Job never started. No worker took it from queue 'cpu' within 600 s, sent 2 times")
    retry = Job.objects.get(retry_of=job)
    assert retry.status == JobStatus.QUEUED, "the failure counts as an attempt: the retry is dispatched"
    assert celery_calls.sent[-1]["args"] == [retry.pk]
    assert dispatch_reap_overdue(now=later + timedelta(seconds=1300)) == 1, "only the retry's message is overdue"


def test_a_claimed_job_is_never_sent_again(
    creator, code_version, cpu, celery_calls, settings, django_capture_on_commit_callbacks
):
    settings.MADO_DISPATCH_TIMEOUT = 600
    with django_capture_on_commit_callbacks(execute=True):
        job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="gpu-1")
    assert dispatch_reap_overdue(now=timezone.now() + timedelta(seconds=601)) == 0
    assert len(celery_calls.sent) == 1
    assert Dispatch.objects.get(task_id=job.celery_task_id).done_at is not None
