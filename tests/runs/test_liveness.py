"""Heartbeats and the crash reaper (docs/design/runs.md#states): time is injected, never slept."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Job, JobStatus, Queue
from jobs.services._common import record_job_alive, record_job_ended
from mado.periodic import beat_schedule
from runs.liveness import runs_reap_crashed
from runs.models import Run, RunStatus
from runs.tasks import reap_crashed_runs
from tests.factories import CodeVersionFactory, RunFactory

FENCE = "HTTP_MADO_FENCING_TOKEN"


@pytest.fixture
def live_run(run):
    """``run`` as the SDK leaves it after starting: running, fencing token 3, heartbeat now."""
    Run.objects.filter(pk=run.pk).update(lease_token=3, heartbeat_at=timezone.now(), started_at=timezone.now())
    run.refresh_from_db()
    return run


def beat(client, run, token=None):
    extra = {} if token is None else {FENCE: str(token)}
    return client.post(f"/api/v1/runs/{run.pk}/heartbeat/", **extra)


def age(run, seconds: float, status=None) -> Run:
    """Set the Run's last heartbeat ``seconds`` ago (and its status), straight in the database."""
    changes = {"heartbeat_at": timezone.now() - timedelta(seconds=seconds)}
    if status:
        changes["status"] = status
    Run.objects.filter(pk=run.pk).update(**changes)
    run.refresh_from_db()
    return run


# --- POST runs/{id}/heartbeat/ ---------------------------------------------------------------


def test_a_heartbeat_with_the_current_token_refreshes_heartbeat_at(client_as, live_run, settings):
    settings.MMT_HEARTBEAT_INTERVAL = 7
    age(live_run, 100)
    before = timezone.now()
    response = beat(client_as("creator"), live_run, token=3)
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "running" and body["heartbeat_interval"] == 7
    live_run.refresh_from_db()
    assert live_run.heartbeat_at >= before


def test_a_heartbeat_without_a_token_is_not_fenced(client_as, live_run):
    assert beat(client_as("creator"), live_run).status_code == 200


def test_a_preempting_run_still_beats(client_as, live_run):
    age(live_run, 10, status=RunStatus.PREEMPTING)
    response = beat(client_as("creator"), live_run, token=3)
    assert response.status_code == 200 and response.json()["status"] == "preempting"


def test_a_heartbeat_with_a_stale_token_is_refused_and_changes_nothing(client_as, live_run):
    live_run = age(live_run, 100)
    response = beat(client_as("creator"), live_run, token=2)
    assert response.status_code == 409
    assert response.json()["error"] == "lease_lost" and response.json()["field"] == "Mado-Fencing-Token"
    assert Run.objects.get(pk=live_run.pk).heartbeat_at == live_run.heartbeat_at


def test_a_crashed_run_that_beats_again_stays_crashed(client_as, live_run):
    age(live_run, 1000)
    assert runs_reap_crashed() == 1
    response = beat(client_as("creator"), live_run, token=3)
    assert response.status_code == 409
    body = response.json()
    assert body["error"] == "run_ended"
    assert f"ended as crashed; resume it (start_run(id='{live_run.external_id}', resume='allow'))" in body["detail"]
    assert Run.objects.get(pk=live_run.pk).status == RunStatus.CRASHED


def test_a_pending_run_cannot_beat(client_as, run):
    Run.objects.filter(pk=run.pk).update(status=RunStatus.PENDING)
    response = beat(client_as("creator"), run)
    assert response.status_code == 409 and response.json()["error"] == "conflict"


@pytest.mark.parametrize("role, code", [("member", 403), ("viewer", 403), ("outsider", 404), ("anonymous", 401)])
def test_only_writers_beat(client_as, live_run, role, code):
    assert beat(client_as(role), live_run).status_code == code


# --- runs_reap_crashed -------------------------------------------------------------------------


def test_a_running_run_silent_past_the_timeout_becomes_crashed(live_run, settings, ended):
    settings.MMT_CRASH_TIMEOUT = 60
    age(live_run, 61)
    now = timezone.now()
    assert runs_reap_crashed(now=now) == 1
    live_run.refresh_from_db()
    assert live_run.status == RunStatus.CRASHED and live_run.ended_at == now
    assert ended == [(live_run.pk, RunStatus.CRASHED)]
    assert runs_reap_crashed(now=now) == 0


def test_a_silent_preempting_run_becomes_preempted(live_run, settings, ended):
    settings.MMT_CRASH_TIMEOUT = 60
    age(live_run, 61, status=RunStatus.PREEMPTING)
    assert runs_reap_crashed() == 1
    assert Run.objects.get(pk=live_run.pk).status == RunStatus.PREEMPTED
    assert ended == [(live_run.pk, RunStatus.PREEMPTED)]


def test_the_timeout_is_measured_from_the_injected_now(live_run, settings):
    settings.MMT_CRASH_TIMEOUT = 300
    age(live_run, 10)
    assert runs_reap_crashed(now=timezone.now() + timedelta(seconds=200)) == 0
    assert Run.objects.get(pk=live_run.pk).status == RunStatus.RUNNING
    assert runs_reap_crashed(now=timezone.now() + timedelta(seconds=400)) == 1


def test_a_run_with_a_fresh_heartbeat_is_untouched(live_run, settings, ended):
    settings.MMT_CRASH_TIMEOUT = 60
    age(live_run, 59)
    assert runs_reap_crashed() == 0
    assert Run.objects.get(pk=live_run.pk).status == RunStatus.RUNNING and ended == []


def test_a_run_that_never_sent_a_heartbeat_is_not_reaped_by_the_crash_timeout(project, creator, settings):
    settings.MMT_CRASH_TIMEOUT = 1
    settings.MMT_SILENT_RUN_TIMEOUT = 10 * 86400
    mlflow_run = RunFactory(project=project, created_by=creator, started_at=timezone.now() - timedelta(days=3))
    assert mlflow_run.heartbeat_at is None
    assert runs_reap_crashed(now=timezone.now() + timedelta(days=1)) == 0
    assert Run.objects.get(pk=mlflow_run.pk).status == RunStatus.RUNNING


@pytest.mark.parametrize("body, reaped", [({}, False), ({"host": "gpu-7", "pid": 4242}, True)])
def test_only_a_start_that_names_its_host_is_watched_for_heartbeats(client_as, project, settings, body, reaped):
    """curl or an older SDK never heartbeats: its run must not turn crashed while it still logs."""
    settings.MMT_CRASH_TIMEOUT = 300
    answer = client_as("creator").post("/api/v1/runs/", {"project": project.slug, **body}, format="json")
    assert answer.status_code == 201
    assert (answer.json()["heartbeat_at"] is not None) is reaped
    assert runs_reap_crashed(now=timezone.now() + timedelta(seconds=301)) == int(reaped)
    expected = RunStatus.CRASHED if reaped else RunStatus.RUNNING
    assert Run.objects.get(pk=answer.json()["id"]).status == expected


@pytest.mark.parametrize("status", [RunStatus.PENDING, RunStatus.FINISHED, RunStatus.FAILED])
def test_runs_that_are_not_live_are_left_alone(live_run, settings, status):
    settings.MMT_CRASH_TIMEOUT = 60
    age(live_run, 1000, status=status)
    assert runs_reap_crashed() == 0
    assert Run.objects.get(pk=live_run.pk).status == status


def _job(run, creator, *, status, job_beat_age):
    """A Job of ``run`` whose worker last beat ``job_beat_age`` s ago, with the facts the jobs app writes."""
    beat = timezone.now() - timedelta(seconds=job_beat_age)
    job = Job.objects.create(
        run=run,
        code_version=CodeVersionFactory(code__project=run.project, code__created_by=creator),
        queue=Queue.objects.get_or_create(name="cpu")[0],
        status=status,
        created_by=creator,
        started_at=timezone.now() - timedelta(hours=1),
        heartbeat_at=beat,
        ended_at=None if status == JobStatus.RUNNING else timezone.now(),
    )
    record_job_alive(run_id=run.pk, now=beat)
    if status != JobStatus.RUNNING:
        record_job_ended(run_id=run.pk)
    return job


def test_a_run_whose_job_is_still_heartbeating_is_not_crashed(live_run, creator, settings):
    settings.MMT_CRASH_TIMEOUT = 60
    settings.MADO_JOB_HEARTBEAT_TIMEOUT = 120
    _job(live_run, creator, status=JobStatus.RUNNING, job_beat_age=30)
    age(live_run, 1000)
    assert runs_reap_crashed() == 0
    assert Run.objects.get(pk=live_run.pk).status == RunStatus.RUNNING


@pytest.mark.parametrize("job_status, job_beat_age", [(JobStatus.RUNNING, 500), (JobStatus.FAILED, 1)])
def test_a_run_whose_job_went_silent_or_ended_is_crashed(live_run, creator, settings, job_status, job_beat_age):
    settings.MMT_CRASH_TIMEOUT = 60
    settings.MADO_JOB_HEARTBEAT_TIMEOUT = 120
    _job(live_run, creator, status=job_status, job_beat_age=job_beat_age)
    age(live_run, 1000)
    assert runs_reap_crashed() == 1
    assert Run.objects.get(pk=live_run.pk).status == RunStatus.CRASHED


def test_the_beat_task_reaps_crashed_runs(live_run, settings):
    settings.MMT_CRASH_TIMEOUT = 60
    age(live_run, 61)
    assert reap_crashed_runs() == 1
    assert Run.objects.get(pk=live_run.pk).status == RunStatus.CRASHED


def test_the_beat_schedule_runs_the_reaper():
    tasks = {entry["task"] for entry in beat_schedule().values()}
    assert "runs.tasks.reap_crashed_runs" in tasks
