"""Dispatch through the outbox (docs/design/worker.md#subprocess): a broker outage leaves Jobs queued and waiting, never
failed or lost; a broker that never answers holds a launch no longer than ``MADO_BROKER_SEND_TIMEOUT_S``
(tests/integration/test_broker_hang.py: the same through a real broker); the backlog gauge counts what still waits."""

import os
import subprocess
import sys
import threading
import time
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
from tests.deployment import ROOT
from tests.jobs.conftest import launch
from tests.test_ops import samples


@pytest.fixture
def broker(monkeypatch, celery_calls):
    """``broker.down = True`` makes every send raise like an unreachable Redis; ``broker.hung`` (an Event) makes it
    wait for the event, then fail, like a broker that accepts connections and never answers; sends that succeed are
    recorded."""
    state = type("Broker", (), {"down": False, "hung": None})()
    recorded = current_app.send_task

    def send_task(name, args=None, **options):
        if state.hung is not None:
            state.hung.wait(60)
            raise TimeoutError("Timeout reading from 127.0.0.1:6379")
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


def test_a_launch_while_the_broker_never_answers_returns_within_the_send_deadline_queued_and_waiting(
    client_as, creator, code_version, cpu, broker, celery_calls, settings, django_capture_on_commit_callbacks
):
    settings.MADO_BROKER_SEND_TIMEOUT_S = 0.5
    broker.hung = threading.Event()
    started = time.monotonic()
    with django_capture_on_commit_callbacks(execute=True):
        response = client_as("creator").post("/api/v1/jobs/", {"code_version_id": code_version.pk}, format="json")
    took = time.monotonic() - started
    broker.hung.set()  # the abandoned send fails now, as the broker's socket timeout would end it
    broker.hung = None
    assert response.status_code == 201, response.content
    assert (response.json()["status"], response.json()["waiting_for_queue"]) == ("queued", True)
    assert took < 0.5 + 5, f"the launch waited {took:.1f} s for a broker that never answers"
    job = Job.objects.get(pk=response.json()["id"])
    row = Dispatch.objects.get(task_id=job.celery_task_id)
    assert row.sent_at is None
    assert row.last_error == "BrokerTimeout: timed out: the broker did not answer within 0.5 s"
    assert flush_dispatches() == 1, "the broker answers again: beat's flush sends it"
    assert [call["task_id"] for call in celery_calls.sent] == [job.celery_task_id]


def test_the_backlog_gauge_counts_only_messages_not_sent_or_whose_job_still_waits(
    client, creator, code_version, cpu, broker, celery_calls, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        taken = launch(creator, code_version, cpu)  # sent, then claimed by a worker
        waiting = launch(creator, code_version, cpu)  # sent, still queued behind others
    broker.down = True
    with django_capture_on_commit_callbacks(execute=True):
        aborted = launch(creator, code_version, cpu)  # never sent, aborted meanwhile
        services.job_abort(actor=creator, job=aborted)
        unsent = launch(creator, code_version, cpu)  # never sent: waits for the broker
    assert services.job_claim(job_id=taken.pk, worker_host="gpu-1") is not None
    assert flush_dispatches() == 0, "premise: the broker is still down"

    found = samples(client.get("/metrics").content.decode())

    backlog = {state: found[("mado_outbox_backlog", (("state", state),))] for state in ("unsent", "unclaimed")}
    assert backlog == {"unsent": 1, "unclaimed": 1}
    assert Dispatch.objects.get(task_id=unsent.celery_task_id).sent_at is None
    assert Dispatch.objects.get(task_id=waiting.celery_task_id).done_at is None
    assert Dispatch.objects.get(task_id=taken.celery_task_id).done_at is not None, "closed by the flush"


@pytest.mark.parametrize("value", ["0", "90", "soon"])
def test_a_send_deadline_out_of_range_stops_start_up_naming_it(tmp_path, value):
    env = {**os.environ, "MADO_DATA_DIR": str(tmp_path), "MADO_BROKER_SEND_TIMEOUT_S": value}
    started = subprocess.run(
        [sys.executable, "-c", "import config.settings"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert started.returncode == 1 and "ImproperlyConfigured: MADO_BROKER_SEND_TIMEOUT_S=" in started.stderr


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
