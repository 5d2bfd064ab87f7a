"""``GET checkpoints/{id}/files/<path>``: one file of a checkpoint saved through MLflow (``layout: "files"``),
streamed and ranged like the tar; the tar download of such a checkpoint says where its files are; every hostile
path matches nothing (docs/api.md "Checkpoints"; docs/design/checkpoints.md#mlflow-checkpoints)."""

import hashlib
import io
from urllib.parse import quote

import pytest

from checkpoints.models import Checkpoint, CheckpointLayout
from mlflow_api.artifacts.checkpoint_files import checkpoint_files_complete_for_run, mlflow_artifact_put
from tests.checkpoints.checkpoint_helpers import complete, declaration, make_tar, put_tar, register
from tests.mlflow_api.test_mlflow_artifacts_checkpoints import FILES, upload

pytestmark = pytest.mark.django_db
ODD = {"données/poids é#1?%.bin": b"accents, a hash, a question mark and a percent sign in the name"}


@pytest.fixture
def files_checkpoint(creator, run):
    """Checkpoint at step 100 of ``run`` made of ``FILES`` (MLflow's ``checkpoints/step-100/``), complete."""
    upload(creator, run, 100)
    for path, data in ODD.items():  # a name the test client's URL would not carry unquoted
        source = io.BytesIO(data)
        mlflow_artifact_put(
            actor=creator, run=run, path=f"checkpoints/step-100/{path}", source=source, expected_size=len(data)
        )
    upload(creator, run, 200, {"other.bin": b"step 200's own file"})
    checkpoint_files_complete_for_run(run_id=run.pk)
    return Checkpoint.objects.get(run=run, step=100)


def file_url(checkpoint_id: int, path: str) -> str:
    return f"/api/v1/checkpoints/{checkpoint_id}/files/{quote(path)}"


def body(response) -> bytes:
    return b"".join(response.streaming_content)


def test_each_file_streams_with_its_sha256_and_a_viewer_may_read_it(api, viewer, files_checkpoint):
    client = api(viewer)
    detail = client.get(f"/api/v1/checkpoints/{files_checkpoint.pk}/").json()
    assert (detail["layout"], detail["tar_size"], detail["tar_sha256"]) == ("files", None, "")
    assert sorted(entry["path"] for entry in detail["manifest"]) == sorted({**FILES, **ODD})
    for path, data in {**FILES, **ODD}.items():
        response = client.get(file_url(files_checkpoint.pk, path))
        assert response.status_code == 200, path
        assert body(response) == data
        assert response["X-Mado-Sha256"] == hashlib.sha256(data).hexdigest() == response["ETag"].strip('"')


def test_a_range_resumes_a_broken_download(api, viewer, files_checkpoint):
    data = FILES["model.pt"]
    response = api(viewer).get(file_url(files_checkpoint.pk, "model.pt"), HTTP_RANGE="bytes=100-")
    assert response.status_code == 206 and body(response) == data[100:]
    assert response["Content-Range"] == f"bytes 100-{len(data) - 1}/{len(data)}"


@pytest.mark.parametrize(
    "path",
    [
        "missing.bin",
        "../step-200/other.bin",  # another checkpoint's file, reached by climbing
        "other.bin",  # another checkpoint's file, by its own name
        "/model.pt",
        "./model.pt",
        "nested//dir/optim.pt",
        "nested/../model.pt",
        "checkpoints/step-100/model.pt",  # the Run artifact's path, not the manifest's
        "model.pt\x00.txt",
        "MODEL.PT",
        "x" * 5000,
    ],
)
def test_a_path_outside_the_manifest_answers_404_naming_it(api, viewer, files_checkpoint, path):
    response = api(viewer).get(f"/api/v1/checkpoints/{files_checkpoint.pk}/files/{quote(path, safe='/')}")
    assert response.status_code == 404, path
    assert response.json()["field"] == "path" and "has no file" in response.json()["detail"]


def test_an_outsider_gets_404(api, outsider, files_checkpoint):
    assert api(outsider).get(file_url(files_checkpoint.pk, "model.pt")).status_code == 404


def test_a_tar_checkpoint_answers_409_pointing_at_its_tar(api, viewer, creator, run):
    client = api(creator)
    created = register(client, run, 10).json()
    tar = make_tar()
    assert put_tar(client, created["id"], tar).status_code == 200
    assert complete(client, created["id"], declaration(tar)).status_code == 200
    response = api(viewer).get(file_url(created["id"], "model.pt"))
    assert response.status_code == 409
    assert response.json()["detail"] == (
        f"checkpoint {created['id']} is stored as one tar: download it with GET checkpoints/{created['id']}/tar"
    )
    assert api(viewer).get(f"/api/v1/checkpoints/{created['id']}/").json()["layout"] == "tar"


def test_the_tar_download_of_a_files_checkpoint_says_to_download_its_files(api, viewer, files_checkpoint):
    response = api(viewer).get(f"/api/v1/checkpoints/{files_checkpoint.pk}/tar")
    assert response.status_code == 409
    detail = response.json()["detail"]
    assert detail.startswith(f"checkpoint {files_checkpoint.pk} is made of separate files (saved through MLflow)")
    assert f"GET checkpoints/{files_checkpoint.pk}/files/<path>" in detail and "is complete" not in detail


def test_a_pending_checkpoint_answers_409_on_both_downloads(api, viewer, creator, run):
    upload(creator, run, 300, {"model.pt": b"half"})
    pending = Checkpoint.objects.get(run=run, step=300)
    assert pending.layout == CheckpointLayout.FILES
    for url in (file_url(pending.pk, "model.pt"), f"/api/v1/checkpoints/{pending.pk}/tar"):
        response = api(viewer).get(url)
        assert response.status_code == 409
        assert response.json()["detail"] == (
            f"checkpoint {pending.pk} is pending: only a complete checkpoint can be downloaded"
        )
