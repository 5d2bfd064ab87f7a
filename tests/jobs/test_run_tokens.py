"""Run tokens (``MMT_API_TOKEN``) act on their own Run only; the SDK attaches to the Job's pre-created Run."""

import pytest
from rest_framework.test import APIClient

from jobs import services
from jobs.models import RunToken
from runs.models import Run, RunStatus
from tests.checkpoints.checkpoint_helpers import save
from tests.factories import RunFactory
from tests.jobs.conftest import checkpoint, launch


@pytest.fixture
def running_job(creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    return services.job_claim(job_id=job.pk, worker_host="gpu-1")


@pytest.fixture
def token(running_job) -> RunToken:
    return services.run_token_issue(job=running_job)


@pytest.fixture
def code_client(token) -> APIClient:
    """What the Job's code uses: ``Authorization: Bearer <MMT_API_TOKEN>``."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token.key}")
    return client


def attach_body(run: Run, **extra) -> dict:
    return {"project": run.project.slug, "external_id": run.external_id, "kind": "training", **extra}


# --- attach (part 4) ------------------------------------------------------------------------


def test_the_sdk_attaches_to_the_pending_run_of_its_job(code_client, running_job):
    run = running_job.run
    body = attach_body(run, parameters={"other": 1}, name="renamed", host="gpu-1", pid=77)
    response = code_client.post("/api/v1/runs/", body, format="json")
    assert response.status_code == 200, response.content
    data = response.json()
    # The Job's name and values stay; keys only the code passes are added.
    assert (data["id"], data["status"], data["parameters"], data["name"]) == (
        run.pk,
        "running",
        {"lr": 0.1, "other": 1},
        "baseline",
    )
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.started_at and run.heartbeat_at
    assert (run.writer_host, run.writer_pid, run.lease_token) == ("gpu-1", 77, 1)


def test_a_second_attach_is_refused_like_any_taken_run_id(code_client, running_job):
    assert code_client.post("/api/v1/runs/", attach_body(running_job.run), format="json").status_code == 200
    response = code_client.post("/api/v1/runs/", attach_body(running_job.run), format="json")
    assert response.status_code == 409 and response.json()["field"] == "external_id"


def test_the_sdk_finds_its_run_again_by_external_id(code_client, running_job):
    run = running_job.run
    response = code_client.get(f"/api/v1/runs/?project=vision&external_id={run.external_id}")
    assert response.status_code == 200 and [r["id"] for r in response.json()["results"]] == [run.pk]


def test_attach_needs_the_runs_creator_and_a_pending_run(api, running_job, member, creator, project):
    run = running_job.run
    assert api(member).post("/api/v1/runs/", attach_body(run), format="json").status_code == 409
    started = RunFactory(project=project, created_by=creator, status=RunStatus.RUNNING)
    assert api(creator).post("/api/v1/runs/", attach_body(started), format="json").status_code == 409
    assert api(creator).post("/api/v1/runs/", attach_body(run), format="json").status_code == 200, (
        "the creator's own token too"
    )


def test_a_viewer_cannot_attach(api, project, viewer):
    pending = RunFactory(project=project, created_by=viewer, status=RunStatus.PENDING)
    assert api(viewer).post("/api/v1/runs/", attach_body(pending), format="json").status_code == 403
    pending.refresh_from_db()
    assert pending.status == RunStatus.PENDING


# --- scope (part 3) --------------------------------------------------------------------------


def test_a_run_token_authenticates_as_the_jobs_creator_and_writes_its_run(code_client, running_job, token):
    run = running_job.run
    assert code_client.get(f"/api/v1/runs/{run.pk}/").json()["id"] == run.pk
    points = {"points": [{"key": "loss", "value": 0.5, "step": 1}]}
    assert code_client.post(f"/api/v1/runs/{run.pk}/metrics/", points, format="json").status_code == 201
    saved = save(code_client, run, 10)
    assert saved["created_by"] == "carol-creator"
    assert code_client.get(f"/api/v1/checkpoints/{saved['id']}/").status_code == 200
    assert code_client.patch(f"/api/v1/runs/{run.pk}/", {"status": "finished"}, format="json").status_code == 200


def test_a_run_token_cannot_touch_another_run_of_the_same_user(code_client, running_job, creator, project):
    other = RunFactory(project=project, created_by=creator)
    foreign_checkpoint = checkpoint(other, 5)
    points = {"points": [{"key": "loss", "value": 0.5, "step": 1}]}
    assert code_client.get(f"/api/v1/runs/{other.pk}/").status_code == 403
    assert code_client.patch(f"/api/v1/runs/{other.pk}/", {"status": "failed"}, format="json").status_code == 403
    assert code_client.post(f"/api/v1/runs/{other.pk}/metrics/", points, format="json").status_code == 403
    assert code_client.post(f"/api/v1/runs/{other.pk}/checkpoints/", {"step": 1}, format="json").status_code == 403
    assert code_client.get(f"/api/v1/checkpoints/{foreign_checkpoint.pk}/").status_code == 403
    assert code_client.delete(f"/api/v1/checkpoints/{foreign_checkpoint.pk}/").status_code == 403
    other.refresh_from_db()
    assert other.status == RunStatus.RUNNING


def test_a_run_token_cannot_list_create_other_runs_or_use_other_endpoints(code_client, running_job, project):
    body = {"project": "vision", "name": "sneaky"}
    assert code_client.post("/api/v1/runs/", body, format="json").status_code == 403
    assert code_client.get("/api/v1/runs/").status_code == 403
    assert code_client.get("/api/v1/runs/?project=vision&external_id=someone-else").status_code == 403
    for path in ("/api/v1/projects/", "/api/v1/jobs/", f"/api/v1/jobs/{running_job.pk}/", "/api/v1/queues/"):
        assert code_client.get(path).status_code == 403, path
    assert code_client.post(f"/api/v1/jobs/{running_job.pk}/abort/").status_code == 403
    assert not Run.objects.filter(name="sneaky").exists()


def test_a_run_token_never_launches_a_resume_even_from_its_own_checkpoint(code_client, running_job):
    own = checkpoint(running_job.run, 5)
    assert code_client.post(f"/api/v1/checkpoints/{own.pk}/resume/", format="json").status_code == 403


def test_a_revoked_or_unknown_token_is_refused(code_client, running_job):
    services.job_finish(job_id=running_job.pk, exit_code=0)
    response = code_client.get(f"/api/v1/runs/{running_job.run_id}/")
    assert response.status_code == 401 and "revoked" in response.json()["detail"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + "0" * 40)
    assert client.get("/api/v1/runs/").status_code == 401


def test_a_run_token_of_an_inactive_user_is_refused(code_client, running_job, creator):
    creator.is_active = False
    creator.save()
    assert code_client.get(f"/api/v1/runs/{running_job.run_id}/").status_code == 401


def test_user_tokens_are_not_scoped(api, running_job, creator, project):
    other = RunFactory(project=project, created_by=creator)
    assert api(creator).get(f"/api/v1/runs/{other.pk}/").status_code == 200


def test_a_resumed_runs_token_reads_but_never_writes_its_source_checkpoint(failed_job, creator):
    source = checkpoint(failed_job.run, 20)
    sibling = checkpoint(failed_job.run, 10)
    resumed = services.run_resume_from_checkpoint(actor=creator, checkpoint=source)
    services.job_claim(job_id=resumed.pk, worker_host="w")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {services.run_token_issue(job=resumed).key}")
    assert client.get(f"/api/v1/checkpoints/{source.pk}/").status_code == 200
    assert client.get(f"/api/v1/checkpoints/{sibling.pk}/").status_code == 403
    assert client.delete(f"/api/v1/checkpoints/{source.pk}/").status_code == 403
    assert client.post(f"/api/v1/checkpoints/{source.pk}/complete/", {}, format="json").status_code == 403
