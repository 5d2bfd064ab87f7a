"""Liveness of writers that send no heartbeats, and points for a crashed Run (docs/design/runs.md#liveness): time is
injected."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from runs.liveness import runs_reap_crashed
from runs.models import MetricPoint, Run, RunStatus
from tests.factories import RunFactory


def post_points(client, run, points, **headers):
    return client.post(
        f"/api/v1/runs/{run.pk}/metrics/", json.dumps({"points": points}), content_type="application/json", **headers
    )


@pytest.fixture
def silent_run(project, creator):
    """A running Run written by curl / the MLflow client: started two hours ago, never a heartbeat."""
    return RunFactory(project=project, created_by=creator, started_at=timezone.now() - timedelta(hours=2))


def test_a_run_without_heartbeats_ends_crashed_after_the_silent_timeout_with_the_reason(silent_run, settings):
    settings.MMT_SILENT_RUN_TIMEOUT = 3600
    assert runs_reap_crashed() == 1
    silent_run.refresh_from_db()
    assert silent_run.status == RunStatus.CRASHED and silent_run.ended_at is not None
    assert "no heartbeat and no write since" in silent_run.ended_reason and "3600 s" in silent_run.ended_reason


def test_any_write_restarts_the_silence_clock(silent_run, settings, client_as):
    settings.MMT_SILENT_RUN_TIMEOUT = 3600
    assert post_points(client_as("creator"), silent_run, [{"key": "loss", "value": 1.0, "step": 0}]).status_code == 201
    assert runs_reap_crashed() == 0
    assert runs_reap_crashed(now=timezone.now() + timedelta(seconds=3599)) == 0
    assert runs_reap_crashed(now=timezone.now() + timedelta(seconds=3601)) == 1


def test_a_project_sets_its_own_silent_timeout(silent_run, settings):
    settings.MMT_SILENT_RUN_TIMEOUT = 24 * 3600
    assert runs_reap_crashed() == 0
    silent_run.project.silent_run_timeout = 600
    silent_run.project.save()
    assert runs_reap_crashed() == 1
    assert "600 s" in Run.objects.get(pk=silent_run.pk).ended_reason


def test_a_run_with_heartbeats_is_not_judged_by_the_silent_timeout(silent_run, settings):
    settings.MMT_SILENT_RUN_TIMEOUT, settings.MMT_CRASH_TIMEOUT = 60, 300
    Run.objects.filter(pk=silent_run.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=100))
    assert runs_reap_crashed() == 0


def test_points_for_a_crashed_run_are_refused_with_run_ended_and_not_stored(silent_run, settings, client_as):
    settings.MMT_SILENT_RUN_TIMEOUT = 60
    runs_reap_crashed()
    response = post_points(client_as("creator"), silent_run, [{"key": "loss", "value": 1.0, "step": 5}])
    assert response.status_code == 409 and response.json()["error"] == "run_ended"
    assert "resume" in response.json()["detail"]
    assert not MetricPoint.objects.filter(run=silent_run).exists()


def test_the_reason_is_in_the_api_and_on_the_run_page(silent_run, settings, client_as, login, creator):
    settings.MMT_SILENT_RUN_TIMEOUT = 60
    runs_reap_crashed()
    answer = client_as("creator").get(f"/api/v1/runs/{silent_run.pk}/").json()
    assert answer["status"] == "crashed" and "silent for more than 60 s" in answer["ended_reason"]
    page = login(creator).get(f"/runs/{silent_run.pk}/").content.decode()
    assert "silent for more than 60 s" in page
