"""API: runs/ and runs/{id}/ (docs/api.md; docs/design/runs.md#states)."""

import pytest

from runs.models import Run, RunKind, RunStatus
from tests.factories import CodeFactory, CodeVersionFactory, DatasetFactory, DatasetVersionFactory, RunFactory

READ = [("admin", 200), ("member", 200), ("creator", 200), ("viewer", 200), ("outsider", 404), ("anonymous", 401)]

RUN_FIELDS = {
    "id",
    "external_id",
    "project",
    "name",
    "kind",
    "status",
    "created_by",
    "parameters",
    "input_dataset_version_ids",
    "code_version_id",
    "parent_id",
    "source_checkpoint_id",
    "heartbeat_at",
    "created_at",
    "started_at",
    "ended_at",
    "ended_reason",
    "last_write_at",
    "url",
    "fencing_token",
    "resumed",
    "resume_count",
    "last_step",
    "step_floor",
    "dropped_points",
    "writer_host",
    "writer_pid",
    "writer_since",
    "heartbeat_interval",
    "crash_timeout",
    # the parity app's facts (docs/design/resume.md#restore-report, #parity)
    "restore_report",
    "resume_ignored_at_step",
    "parity",
    "resume_segments",  # docs/design/resume.md#same-run-parity
}


@pytest.mark.parametrize("role, status", READ)
def test_run_detail_permission_matrix(client_as, run, role, status):
    response = client_as(role).get(f"/api/v1/runs/{run.pk}/")
    assert response.status_code == status
    if status == 200:
        body = response.json()
        assert set(body) == RUN_FIELDS
        assert (body["project"], body["created_by"], body["name"]) == ("vision", "carol-creator", "baseline")
        assert body["url"] == f"http://testserver/runs/{run.pk}/"


@pytest.mark.parametrize(
    "role, visible",
    [
        ("admin", True),
        ("member", True),
        ("creator", True),
        ("viewer", True),
        ("outsider", False),
    ],
)
def test_run_list_shows_only_runs_of_the_users_projects(client_as, run, other_project, role, visible):
    foreign = RunFactory(project=other_project)
    ids = [r["id"] for r in client_as(role).get("/api/v1/runs/").json()["results"]]
    assert ids == ([run.pk] if visible else [foreign.pk])


def test_run_list_refuses_anonymous(client_as, run):
    assert client_as("anonymous").get("/api/v1/runs/").status_code == 401


def test_run_list_filters_by_project_status_and_kind(client_as, project, creator, run):
    other = RunFactory(project=project, created_by=creator, status=RunStatus.FAILED, kind=RunKind.FINE_TUNING)
    client = client_as("viewer")
    assert [r["id"] for r in client.get("/api/v1/runs/?project=vision&status=failed").json()["results"]] == [other.pk]
    assert [r["id"] for r in client.get("/api/v1/runs/?kind=training").json()["results"]] == [run.pk]


def test_run_list_finds_a_run_by_its_external_id(client_as, project, creator, run):
    RunFactory(project=project, created_by=creator, external_id="other-id")
    results = client_as("viewer").get(f"/api/v1/runs/?project=vision&external_id={run.external_id}").json()["results"]
    assert [r["id"] for r in results] == [run.pk]


def test_run_list_of_another_project_answers_404(client_as, run, other_project):
    assert client_as("viewer").get("/api/v1/runs/?project=other").status_code == 404


@pytest.mark.parametrize("slug", ["other", "nlp"])
def test_starting_a_run_in_another_or_no_project_names_the_slug_and_how_to_create_one(client_as, other_project, slug):
    """Another user's Project and none at all get the same answer: it repeats what was asked, nothing more."""
    response = client_as("member").post("/api/v1/runs/", {"project": slug}, format="json")
    assert response.status_code == 404
    assert response.json() == {
        "error": "not_found",
        "detail": f"no project '{slug}' among your projects: create it (POST /api/v1/projects/ with its name and "
        "slug) or ask its admin to add you",
        "field": "project",
    }
    assert not Run.objects.exists()


def test_run_list_with_an_unknown_status_names_the_field(client_as, run):
    response = client_as("viewer").get("/api/v1/runs/?status=sleeping")
    assert response.status_code == 400 and response.json()["field"] == "status"


@pytest.mark.parametrize(
    "role, status",
    [
        ("admin", 201),
        ("member", 201),
        ("creator", 201),
        ("viewer", 403),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_run_create_permission_matrix(client_as, project, role, status):
    response = client_as(role).post("/api/v1/runs/", {"project": "vision", "name": "lr-sweep"}, format="json")
    assert response.status_code == status
    assert Run.objects.filter(name="lr-sweep").exists() == (status == 201)


def test_run_create_records_its_inputs(client_as, project, member):
    version = DatasetVersionFactory(dataset=DatasetFactory(project=project))
    code_version = CodeVersionFactory(code=CodeFactory(project=project, created_by=member))
    parent = RunFactory(project=project, created_by=member)
    body = {
        "project": "vision",
        "name": "ft",
        "kind": "fine_tuning",
        "parameters": {"lr": 0.001},
        "input_dataset_version_ids": [version.pk],
        "code_version_id": code_version.pk,
        "parent_id": parent.pk,
        "external_id": "abc123",
    }
    response = client_as("member").post("/api/v1/runs/", body, format="json")
    assert response.status_code == 201
    got = response.json()
    assert (got["kind"], got["status"], got["created_by"], got["external_id"]) == (
        "fine_tuning",
        "running",
        "mike-member",
        "abc123",
    )
    assert got["parameters"] == {"lr": 0.001} and got["input_dataset_version_ids"] == [version.pk]
    assert (got["code_version_id"], got["parent_id"]) == (code_version.pk, parent.pk)
    assert got["started_at"] is not None


def test_run_create_refuses_another_projects_dataset_version_naming_the_field(client_as, project, other_project):
    foreign = DatasetVersionFactory(dataset=DatasetFactory(project=other_project))
    response = client_as("member").post(
        "/api/v1/runs/", {"project": "vision", "input_dataset_version_ids": [foreign.pk]}, format="json"
    )
    assert response.status_code == 400 and response.json()["field"] == "input_dataset_version_ids"
    assert not Run.objects.exists()


def test_run_create_with_a_taken_external_id_is_a_conflict(client_as, run):
    response = client_as("member").post(
        "/api/v1/runs/", {"project": "vision", "external_id": run.external_id}, format="json"
    )
    assert response.status_code == 409 and response.json()["field"] == "external_id"


def test_run_create_with_a_bad_kind_names_kind(client_as, project):
    response = client_as("member").post("/api/v1/runs/", {"project": "vision", "kind": "inference"}, format="json")
    assert response.status_code == 400 and response.json()["field"] == "kind"


@pytest.mark.parametrize(
    "role, status",
    [
        ("admin", 200),
        ("member", 403),
        ("creator", 200),
        ("viewer", 403),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_run_status_change_permission_matrix(client_as, run, role, status):
    response = client_as(role).patch(f"/api/v1/runs/{run.pk}/", {"status": "finished"}, format="json")
    assert response.status_code == status
    run.refresh_from_db()
    assert (run.status == RunStatus.FINISHED) == (status == 200)
    if status == 200:
        assert response.json()["status"] == "finished" and response.json()["ended_at"] is not None


def test_a_final_status_is_kept_another_final_one_is_a_conflict(client_as, run):
    client = client_as("creator")
    assert client.patch(f"/api/v1/runs/{run.pk}/", {"status": "failed"}, format="json").status_code == 200
    assert client.patch(f"/api/v1/runs/{run.pk}/", {"status": "failed"}, format="json").status_code == 200
    response = client.patch(f"/api/v1/runs/{run.pk}/", {"status": "finished"}, format="json")
    assert response.status_code == 409 and response.json()["field"] == "status"
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED


def test_an_unknown_status_names_status(client_as, run):
    response = client_as("creator").patch(f"/api/v1/runs/{run.pk}/", {"status": "sleeping"}, format="json")
    assert response.status_code == 400 and response.json()["field"] == "status"


def test_a_missing_run_and_another_projects_run_answer_the_same_404(client_as, run, other_project):
    foreign = RunFactory(project=other_project)
    client = client_as("admin")
    missing, hidden = client.get("/api/v1/runs/999999/"), client.get(f"/api/v1/runs/{foreign.pk}/")
    assert missing.status_code == hidden.status_code == 404
    assert missing.json()["error"] == hidden.json()["error"] == "not_found"
