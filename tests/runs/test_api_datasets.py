"""API: projects/{slug}/datasets/ and datasets/{id}/versions/ (docs/api.md)."""

import pytest

from runs.models import Dataset, DatasetVersion
from tests.factories import DatasetFactory, DatasetVersionFactory

READ = [("admin", 200), ("member", 200), ("creator", 200), ("viewer", 200), ("outsider", 404), ("anonymous", 401)]
WRITE = [("admin", 201), ("member", 201), ("creator", 201), ("viewer", 403), ("outsider", 404), ("anonymous", 401)]


@pytest.fixture
def dataset(project):
    return DatasetFactory(project=project, name="digits")


@pytest.mark.parametrize("role, status", READ)
def test_dataset_list_permission_matrix(client_as, dataset, role, status):
    response = client_as(role).get("/api/v1/projects/vision/datasets/")
    assert response.status_code == status
    if status == 200:
        assert [(d["id"], d["name"]) for d in response.json()["results"]] == [(dataset.pk, "digits")]
        assert set(response.json()["results"][0]) == {"id", "name", "created_at"}


@pytest.mark.parametrize("role, status", WRITE)
def test_dataset_create_permission_matrix(client_as, project, role, status):
    response = client_as(role).post("/api/v1/projects/vision/datasets/", {"name": "cifar"}, format="json")
    assert response.status_code == status
    assert Dataset.objects.filter(project=project, name="cifar").exists() == (status == 201)


def test_a_duplicate_dataset_name_is_a_conflict(client_as, dataset):
    response = client_as("member").post("/api/v1/projects/vision/datasets/", {"name": "digits"}, format="json")
    assert response.status_code == 409 and response.json()["field"] == "name"


@pytest.mark.parametrize("role, status", READ)
def test_dataset_version_list_permission_matrix(client_as, dataset, role, status):
    DatasetVersionFactory(dataset=dataset, version="2024-01")
    response = client_as(role).get(f"/api/v1/datasets/{dataset.pk}/versions/")
    assert response.status_code == status
    if status == 200:
        row = response.json()["results"][0]
        assert row["version"] == "2024-01" and row["dataset_id"] == dataset.pk
        assert set(row) == {"id", "dataset_id", "version", "uri", "description", "created_at"}


@pytest.mark.parametrize("role, status", WRITE)
def test_dataset_version_create_permission_matrix(client_as, dataset, role, status):
    body = {"version": "v2", "uri": "s3://data/digits/v2", "description": "more samples"}
    response = client_as(role).post(f"/api/v1/datasets/{dataset.pk}/versions/", body, format="json")
    assert response.status_code == status
    assert DatasetVersion.objects.filter(dataset=dataset, version="v2").exists() == (status == 201)
    if status == 201:
        assert response.json()["uri"] == "s3://data/digits/v2"


def test_a_duplicate_version_label_is_a_conflict_naming_version(client_as, dataset):
    DatasetVersionFactory(dataset=dataset, version="v1", uri="keep-me")
    response = client_as("member").post(
        f"/api/v1/datasets/{dataset.pk}/versions/", {"version": "v1", "uri": "x"}, format="json"
    )
    assert response.status_code == 409 and response.json()["field"] == "version"
    assert DatasetVersion.objects.get(dataset=dataset, version="v1").uri == "keep-me"


def test_another_projects_dataset_answers_404_even_to_its_admin_elsewhere(client_as, other_project, outsider, member):
    foreign = DatasetFactory(project=other_project)
    assert client_as("member").get(f"/api/v1/datasets/{foreign.pk}/versions/").status_code == 404
    assert client_as("outsider").get(f"/api/v1/datasets/{foreign.pk}/versions/").status_code == 200
