"""Run status changes through ``PATCH runs/{id}/`` (docs/design/runs.md#states): preempting is sticky, fencing."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs.models import Run, RunStatus

FENCE = "HTTP_MADO_FENCING_TOKEN"


@pytest.fixture
def sdk(client_as, run):
    """PATCH ``run``'s status as its SDK writer (fencing token 5; the Run beats)."""
    Run.objects.filter(pk=run.pk).update(lease_token=5, heartbeat_at=timezone.now(), started_at=timezone.now())
    client = client_as("creator")

    def patch(status, token=5):
        extra = {} if token is None else {FENCE: str(token)}
        return client.patch(f"/api/v1/runs/{run.pk}/", {"status": status}, format="json", **extra)

    return patch


def status_of(run) -> str:
    return Run.objects.get(pk=run.pk).status


def test_running_becomes_preempting_and_preempting_is_idempotent(sdk, run, ended):
    assert sdk("preempting").json()["status"] == "preempting"
    assert sdk("preempting").status_code == 200
    assert status_of(run) == RunStatus.PREEMPTING and ended == []


def test_preempting_is_sticky(sdk, run):
    sdk("preempting")
    response = sdk("running")
    assert response.status_code == 409 and response.json()["field"] == "status"
    assert "preempting" in response.json()["detail"]
    assert status_of(run) == RunStatus.PREEMPTING


@pytest.mark.parametrize(
    "asked, final",
    [
        ("finished", RunStatus.FINISHED),
        ("failed", RunStatus.PREEMPTED),
        ("crashed", RunStatus.PREEMPTED),
        ("preempted", RunStatus.PREEMPTED),
    ],
)
def test_from_preempting_exit_zero_finishes_anything_else_is_preempted(sdk, run, ended, asked, final):
    sdk("preempting")
    response = sdk(asked)
    assert response.status_code == 200 and response.json()["status"] == final
    run.refresh_from_db()
    assert run.status == final and run.ended_at is not None
    assert ended == [(run.pk, final)]


def test_a_preempted_run_reporting_failed_again_stays_preempted(sdk, run, ended):
    sdk("preempting")
    sdk("preempted")
    assert sdk("failed").json()["status"] == "preempted"
    assert ended == [(run.pk, RunStatus.PREEMPTED)]


@pytest.mark.parametrize("final", ["finished", "failed", "crashed", "preempted"])
def test_a_final_run_is_not_restarted_by_a_status_change(sdk, run, final):
    sdk(final)
    response = sdk("running")
    assert response.status_code == 409
    assert "only a resume restarts it" in response.json()["detail"]
    assert status_of(run) == final


def test_entering_a_final_state_tells_the_sweep_hook_once(sdk, run, ended):
    sdk("finished")
    sdk("finished")
    assert ended == [(run.pk, RunStatus.FINISHED)]


def test_a_status_change_with_a_stale_token_is_refused(sdk, run, ended):
    response = sdk("finished", token=4)
    assert response.status_code == 409
    assert response.json()["error"] == "lease_lost" and response.json()["field"] == "Mado-Fencing-Token"
    assert status_of(run) == RunStatus.RUNNING and ended == []


def test_a_status_change_without_a_token_is_not_fenced(sdk, run):
    assert sdk("preempting", token=None).status_code == 200


def test_a_bad_fencing_token_is_a_400_naming_the_header(sdk):
    response = sdk("finished", token="abc")
    assert response.status_code == 400 and response.json()["field"] == "Mado-Fencing-Token"


def test_a_status_change_of_a_run_that_never_beat_keeps_it_unreapable(client_as, run):
    assert run.heartbeat_at is None
    client_as("creator").patch(f"/api/v1/runs/{run.pk}/", {"status": "preempting"}, format="json")
    assert Run.objects.get(pk=run.pk).heartbeat_at is None


def test_finishing_answers_the_run_as_stored_without_reading_its_project_or_creator_again(sdk, run):
    # Twenty jobs finishing in the same second land on the web pool together (docs/design/runs.md#states): the answer
    # reuses the Project and creator read with the Run.
    with CaptureQueriesContext(connection) as queries:
        response = sdk("finished")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "finished" and body["ended_at"] == Run.objects.get(pk=run.pk).ended_at.isoformat().replace(
        "+00:00", "Z"
    )
    assert body["project"] == run.project.slug and body["created_by"] == run.created_by.username
    statements = [q["sql"] for q in queries.captured_queries]
    assert not [
        sql for sql in statements if sql.startswith('SELECT "runs_project"') or sql.startswith('SELECT "auth_user"')
    ]
