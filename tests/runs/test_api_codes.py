"""API: projects/{slug}/codes/ and codes/{id}/versions/ with a streamed archive (docs/api.md)."""

import hashlib
import json

import pytest
from django.core.files.storage import storages
from django.core.files.uploadedfile import SimpleUploadedFile

from checkpoints.models import Artifact
from runs.models import Code, CodeVersion
from tests.factories import CodeFactory, CodeVersionFactory

READ = [("admin", 200), ("member", 200), ("creator", 200), ("viewer", 200), ("outsider", 404), ("anonymous", 401)]
WRITE = [("admin", 201), ("member", 201), ("creator", 201), ("viewer", 403), ("outsider", 404), ("anonymous", 401)]


@pytest.fixture
def code(project, creator):
    return CodeFactory(project=project, created_by=creator, name="trainer")


def upload(client, code, entrypoint='["python", "train.py"]', archive=None):
    body = {"entrypoint": entrypoint}
    if archive is not None:
        body["archive"] = archive
    return client.post(f"/api/v1/codes/{code.pk}/versions/", body, format="multipart")


@pytest.mark.parametrize("role, status", READ)
def test_code_list_permission_matrix(client_as, code, role, status):
    response = client_as(role).get("/api/v1/projects/vision/codes/")
    assert response.status_code == status
    if status == 200:
        assert [c["name"] for c in response.json()["results"]] == ["trainer"]


@pytest.mark.parametrize("role, status", WRITE)
def test_code_create_permission_matrix(client_as, project, role, status):
    response = client_as(role).post("/api/v1/projects/vision/codes/", {"name": "evaluator"}, format="json")
    assert response.status_code == status
    assert Code.objects.filter(project=project, name="evaluator").exists() == (status == 201)


@pytest.mark.parametrize("role, status", READ)
def test_code_version_list_permission_matrix(client_as, code, role, status):
    CodeVersionFactory(code=code, version=1)
    response = client_as(role).get(f"/api/v1/codes/{code.pk}/versions/")
    assert response.status_code == status
    if status == 200:
        row = response.json()["results"][0]
        assert set(row) == {"id", "code_id", "version", "entrypoint", "archive_sha256", "archive_size", "created_at"}
        assert row["archive_sha256"] is None


@pytest.mark.parametrize("role, status", WRITE)
def test_code_version_upload_permission_matrix(client_as, code, role, status):
    response = upload(client_as(role), code, archive=SimpleUploadedFile("src.tar", b"tar bytes"))
    assert response.status_code == status
    assert CodeVersion.objects.filter(code=code).exists() == (status == 201)
    assert Artifact.objects.exists() == (status == 201)


def test_an_uploaded_archive_is_stored_as_a_run_less_artifact_with_its_digest(client_as, code):
    content = b"x" * (3 * 1024 * 1024 + 7)
    response = upload(client_as("creator"), code, archive=SimpleUploadedFile("src.tar.gz", content))
    assert response.status_code == 201
    body = response.json()
    assert body["version"] == 1 and body["entrypoint"] == ["python", "train.py"]
    assert body["archive_sha256"] == hashlib.sha256(content).hexdigest() and body["archive_size"] == len(content)
    artifact = CodeVersion.objects.get(pk=body["id"]).archive
    assert artifact.run is None and artifact.project == code.project and artifact.path == f"codes/{code.pk}/src.tar.gz"
    with storages["artifacts"].open(artifact.storage_key, "rb") as stored:
        assert stored.read() == content


def test_versions_are_numbered_in_order(client_as, code):
    client = client_as("member")
    numbers = [upload(client, code).json()["version"] for _ in range(3)]
    assert numbers == [1, 2, 3]


@pytest.mark.parametrize("entrypoint", ["python train.py", "[]", '["python", 3]', '[""]'])
def test_a_bad_entrypoint_names_the_field_and_keeps_no_bytes(client_as, code, entrypoint):
    response = upload(client_as("member"), code, entrypoint=entrypoint, archive=SimpleUploadedFile("a.tar", b"abc"))
    assert response.status_code == 400 and response.json()["field"] == "entrypoint"
    assert not CodeVersion.objects.exists() and not Artifact.objects.exists()


def test_a_json_entrypoint_list_is_accepted_without_an_archive(client_as, code):
    response = client_as("member").post(
        f"/api/v1/codes/{code.pk}/versions/",
        json.dumps({"entrypoint": ["python", "-m", "train"]}),
        content_type="application/json",
    )
    assert response.status_code == 201 and response.json()["entrypoint"] == ["python", "-m", "train"]
    assert response.json()["archive_size"] is None
