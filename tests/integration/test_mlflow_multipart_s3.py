"""MLflow multipart upload (``mpu/create|complete|abort``) straight to a real S3-compatible server (moto's,
in-process): the parts go to presigned URLs, ``complete`` records the Artifact as a single PUT does.
"""

import hashlib
import os

import pytest
import requests
from rest_framework.test import APIClient

from checkpoints.models import Artifact, Checkpoint, CheckpointLayout, CheckpointState
from runs.models import RunKind
from tests.factories import RunFactory, api_key, run_token
from tests.integration.conftest import S3_BUCKET as BUCKET
from tests.integration.conftest import s3_keys as keys

pytestmark = pytest.mark.django_db

MIB = 1024 * 1024
PART = 5 * MIB
BLOB = os.urandom(2 * PART + 12345)  # 3 parts: 5 MiB, 5 MiB, the rest
BASE = "/api/2.0/mlflow-artifacts"


@pytest.fixture
def training_run(project, member):
    """A Run of ``member``, who writes to it in these tests (docs/design/runs.md#write-rule: its creator)."""
    return RunFactory(project=project, created_by=member, name="train", kind=RunKind.TRAINING)


def bearer(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key(user)}")
    return client


def mpu(client, action, run, path, **payload):
    return client.post(
        f"{BASE}/mpu/{action}/{run.project_id}/{run.external_id}/artifacts/{path}",
        {"path": "/local/file", **payload},
        format="json",
    )


def open_uploads(s3) -> list:
    return s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])


def upload(client, run, path, data=BLOB):
    """create, PUT each part to its presigned URL (as the MLflow client does), complete."""
    created = mpu(client, "create", run, path, num_parts=3)
    assert created.status_code == 200, created.content
    body = created.json()
    assert [c["part_number"] for c in body["credentials"]] == [1, 2, 3]
    parts = []
    for credential in body["credentials"]:
        number = credential["part_number"]
        response = requests.put(
            credential["url"], data=data[(number - 1) * PART : number * PART], headers=credential["headers"], timeout=30
        )
        assert response.status_code == 200, response.text
        parts.append({"part_number": number, "etag": response.headers["ETag"], "url": credential["url"]})
    return mpu(client, "complete", run, path, upload_id=body["upload_id"], parts=parts)


def test_multipart_upload_records_the_artifact_and_joins_the_checkpoint(s3_bucket, member, viewer, training_run):
    client = bearer(member)
    response = upload(client, training_run, "checkpoints/step-7/model.bin")
    assert response.status_code == 200, response.content
    artifact = Artifact.objects.get(run=training_run, path="checkpoints/step-7/model.bin")
    assert artifact.size == len(BLOB)
    assert artifact.sha256 == hashlib.sha256(BLOB).hexdigest()
    assert keys(s3_bucket) == [f"prefix/{artifact.storage_key}"]
    assert not open_uploads(s3_bucket)
    checkpoint = Checkpoint.objects.get(run=training_run, step=7)
    assert (checkpoint.layout, checkpoint.state) == (CheckpointLayout.FILES, CheckpointState.PENDING)
    assert checkpoint.file_count == 1 and checkpoint.total_bytes == len(BLOB)
    entry = checkpoint.manifest.get()
    assert (entry.path, entry.size, entry.sha256, entry.artifact_id) == (
        "model.bin",
        artifact.size,
        artifact.sha256,
        artifact.pk,
    )
    # readable back through the proxy like a PUT's file
    got = bearer(viewer).get(
        f"{BASE}/artifacts/{training_run.project_id}/{training_run.external_id}/artifacts/checkpoints/step-7/model.bin",
        HTTP_RANGE="bytes=0-9",
    )
    assert got.status_code == 206 and b"".join(got.streaming_content) == BLOB[:10]


def test_a_lightning_ckpt_uploaded_in_parts_is_a_complete_checkpoint_at_its_step(s3_bucket, member, training_run):
    """A large ``.ckpt`` from ``MLFlowLogger`` comes in parts (docs/design/checkpoints.md#mlflow-checkpoints)."""
    client = bearer(member)
    path = "epoch=0-step=500/epoch=0-step=500.ckpt"
    assert upload(client, training_run, path).status_code == 200
    checkpoint = Checkpoint.objects.get(run=training_run)
    assert (checkpoint.step, checkpoint.state, checkpoint.framework) == (500, CheckpointState.COMPLETE, "lightning")
    assert list(checkpoint.manifest.values_list("path", "sha256")) == [
        ("epoch=0-step=500.ckpt", hashlib.sha256(BLOB).hexdigest())
    ]
    again = upload(client, training_run, "epoch=0-step=500-v1/epoch=0-step=500-v1.ckpt")  # the step is complete
    assert again.status_code == 200 and Checkpoint.objects.get(run=training_run).file_count == 1
    assert Artifact.objects.filter(run=training_run).count() == 2 and not open_uploads(s3_bucket)


def test_the_same_bytes_again_is_a_no_op_and_different_bytes_conflict(s3_bucket, member, training_run):
    client = bearer(member)
    assert upload(client, training_run, "model.bin").status_code == 200
    stored = keys(s3_bucket)
    assert upload(client, training_run, "model.bin").status_code == 200
    assert keys(s3_bucket) == stored
    other = bytearray(BLOB)
    other[-1] ^= 0xFF
    response = upload(client, training_run, "model.bin", data=bytes(other))
    assert response.status_code == 409, response.content
    assert keys(s3_bucket) == stored
    assert Artifact.objects.get(run=training_run, path="model.bin").sha256 == hashlib.sha256(BLOB).hexdigest()


def test_abort_leaves_no_object(s3_bucket, member, training_run):
    client = bearer(member)
    body = mpu(client, "create", training_run, "big.bin", num_parts=3).json()
    first = body["credentials"][0]
    assert requests.put(first["url"], data=BLOB[:PART], timeout=30).status_code == 200
    assert len(open_uploads(s3_bucket)) == 1
    response = mpu(client, "abort", training_run, "big.bin", upload_id=body["upload_id"])
    assert response.status_code == 200, response.content
    assert not open_uploads(s3_bucket)
    assert keys(s3_bucket) == []
    assert not Artifact.objects.exists()


def test_an_upload_id_only_completes_its_own_path(s3_bucket, member, training_run):
    client = bearer(member)
    body = mpu(client, "create", training_run, "a.bin", num_parts=1).json()
    response = mpu(
        client, "complete", training_run, "b.bin", upload_id=body["upload_id"], parts=[{"part_number": 1, "etag": "x"}]
    )
    assert response.status_code == 400
    assert mpu(client, "complete", training_run, "a.bin", upload_id="forged", parts=[]).status_code == 400


@pytest.mark.parametrize("role, status", [("outsider", 404), ("viewer", 403)])
def test_non_members_and_viewers_are_refused(s3_bucket, member, viewer, outsider, training_run, role, status):
    user = {"viewer": viewer, "outsider": outsider}[role]
    for action, payload in [
        ("create", {"num_parts": 3}),
        ("complete", {"upload_id": "x", "parts": []}),
        ("abort", {"upload_id": "x"}),
    ]:
        assert mpu(bearer(user), action, training_run, "big.bin", **payload).status_code == status, action
    assert not open_uploads(s3_bucket)


def test_a_run_token_acts_only_on_its_own_run(s3_bucket, member, project, training_run):

    other = RunFactory(project=project, created_by=member, kind=RunKind.TRAINING)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {run_token(other, member).key}")
    assert mpu(client, "create", training_run, "big.bin", num_parts=1).status_code == 403
    assert mpu(client, "create", other, "big.bin", num_parts=1).status_code == 200
