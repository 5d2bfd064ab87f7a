"""Checkpoints on a real S3-compatible server (moto's, in-process): presigned multipart upload straight to the
bucket, the verification task, ranged download, deletion, and the upload through the web process.
"""

import hashlib
import os

import pytest
import requests
from celery import current_app

from checkpoints.models import Checkpoint, CheckpointState
from mado import outbox
from tests.checkpoints.checkpoint_helpers import declaration, make_tar, manifest_of, put_tar, register, save
from tests.integration.conftest import S3_BUCKET as BUCKET
from tests.integration.conftest import s3_keys as keys
from worker import tasks  # noqa: F401 - registers the verification task

MIB = 1024 * 1024
FILES = {"model.pt": os.urandom(17 * MIB + 123), "optim.pt": os.urandom(1000)}
TAR = make_tar(FILES)


@pytest.fixture
def s3(s3_bucket, settings, monkeypatch):
    """The S3 bucket with 8 MiB parts, and the verification task run in-process (in the test's thread)."""
    settings.MADO_CHECKPOINT_PART_SIZE = 8 * MIB
    queued = []
    monkeypatch.setattr(  # the outbox's send after commit
        current_app,
        "send_task",
        lambda name, args=(), **options: queued.append(options) or current_app.tasks[name].apply(args=args),
    )
    # The verification runs in this thread, inside the test's transaction, not on broker_call's thread.
    monkeypatch.setattr(outbox, "broker_call", lambda call, timeout=None: call())
    s3_bucket.queued = queued
    return s3_bucket


def open_uploads(client) -> list[str]:
    return [u["UploadId"] for u in client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])]


def upload_parts(api_client, checkpoint_id: int, tar: bytes = TAR) -> tuple[str, list[dict]]:
    """Ask for presigned part URLs and PUT the parts straight to the bucket, as the SDK does."""
    answer = api_client.post(
        f"/api/v1/checkpoints/{checkpoint_id}/upload-parts/", {"tar_size": len(tar)}, format="json"
    )
    assert answer.status_code == 200, answer.content
    body = answer.json()
    size = body["part_size"]
    parts = []
    for number, url in enumerate(body["urls"], start=1):
        response = requests.put(url, data=tar[(number - 1) * size : number * size], timeout=30)
        assert response.status_code == 200, response.text
        parts.append({"part_number": number, "etag": response.headers["ETag"]})
    return body["upload_id"], parts


def test_a_direct_upload_is_verified_by_the_task_then_downloaded_with_ranges(
    s3, api, creator, viewer, run, monkeypatch, django_capture_on_commit_callbacks
):
    client = api(creator)
    created = register(client, run, 10, key="k10").json()
    assert created["direct_upload"] is True
    upload_id, parts = upload_parts(client, created["id"])
    assert len(parts) == 3  # 17 MiB in 8 MiB parts
    from storages.backends import s3 as s3_backend

    monkeypatch.setattr(s3_backend.S3File, "__init__", lambda *a, **k: pytest.fail("S3File buffers the whole object"))
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(
            f"/api/v1/checkpoints/{created['id']}/complete/",
            {**declaration(TAR, FILES), "upload_id": upload_id, "parts": parts},
            format="json",
        )
        assert answer.status_code == 202 and answer.json()["state"] == "pending"
    assert len(s3.queued) == 1
    detail = client.get(f"/api/v1/checkpoints/{created['id']}/").json()
    assert detail["state"] == "complete" and detail["tar_sha256"] == hashlib.sha256(TAR).hexdigest()
    assert detail["manifest"] == manifest_of(FILES) and detail["error"] == ""
    checkpoint = Checkpoint.objects.get(pk=created["id"])
    assert keys(s3) == [f"prefix/{checkpoint.artifact.storage_key}"] and open_uploads(s3) == []
    url = f"/api/v1/checkpoints/{created['id']}/tar"
    first = api(viewer).get(url, HTTP_RANGE=f"bytes=0-{9 * MIB}")
    rest = api(viewer).get(url, HTTP_RANGE=f"bytes={9 * MIB + 1}-")
    assert (first.status_code, rest.status_code) == (206, 206)
    assert b"".join(first.streaming_content) + b"".join(rest.streaming_content) == TAR
    again = client.post(
        f"/api/v1/checkpoints/{created['id']}/complete/",
        {**declaration(TAR, FILES), "upload_id": upload_id, "parts": parts},
        format="json",
    )
    assert again.status_code == 200 and again.json()["state"] == "complete"


def test_a_direct_upload_that_differs_from_its_manifest_stays_pending_with_the_error(
    s3, api, creator, run, django_capture_on_commit_callbacks
):
    client = api(creator)
    created = register(client, run, 10).json()
    upload_id, parts = upload_parts(client, created["id"])
    wrong = {**declaration(TAR, FILES), "manifest": manifest_of({**FILES, "optim.pt": b"other"})}
    with django_capture_on_commit_callbacks(execute=True):
        assert (
            client.post(
                f"/api/v1/checkpoints/{created['id']}/complete/",
                {**wrong, "upload_id": upload_id, "parts": parts},
                format="json",
            ).status_code
            == 202
        )
    detail = client.get(f"/api/v1/checkpoints/{created['id']}/").json()
    assert detail["state"] == "pending"
    assert detail["error"].startswith(f"Checkpoint {created['id']} size mismatch: 'optim.pt'")
    assert keys(s3) == [] and open_uploads(s3) == []
    assert client.get(f"/api/v1/runs/{run.pk}/checkpoints/").json()["count"] == 0


def test_asking_for_parts_again_replaces_and_aborts_the_first_upload(
    s3, api, creator, run, django_capture_on_commit_callbacks
):
    client = api(creator)
    created = register(client, run, 10).json()
    with django_capture_on_commit_callbacks(execute=True):
        first = client.post(f"/api/v1/checkpoints/{created['id']}/upload-parts/", {"tar_size": len(TAR)}, format="json")
    with django_capture_on_commit_callbacks(execute=True):
        second = client.post(
            f"/api/v1/checkpoints/{created['id']}/upload-parts/", {"tar_size": len(TAR)}, format="json"
        )
    assert open_uploads(s3) == [second.json()["upload_id"]] != [first.json()["upload_id"]]
    stale = client.post(
        f"/api/v1/checkpoints/{created['id']}/complete/",
        {**declaration(TAR, FILES), "upload_id": first.json()["upload_id"], "parts": [{"part_number": 1, "etag": "x"}]},
        format="json",
    )
    assert stale.status_code == 400 and stale.json()["field"] == "upload_id"


def test_missing_parts_are_refused_naming_parts(s3, api, creator, run):
    client = api(creator)
    created = register(client, run, 10).json()
    upload_id, parts = upload_parts(client, created["id"])
    response = client.post(
        f"/api/v1/checkpoints/{created['id']}/complete/",
        {**declaration(TAR, FILES), "upload_id": upload_id, "parts": parts[:2]},
        format="json",
    )
    assert response.status_code == 400 and response.json()["field"] == "parts"
    assert Checkpoint.objects.get(pk=created["id"]).state == CheckpointState.PENDING


def test_the_upload_through_the_web_process_and_deletion_work_on_s3(
    s3, api, creator, admin, run, settings, django_capture_on_commit_callbacks
):
    settings.MMT_CHECKPOINT_KEEP_COUNT = 1
    client = api(creator)
    with django_capture_on_commit_callbacks(execute=True):
        older = save(client, run, 10, files=FILES)
        save(client, run, 20)
    assert len(keys(s3)) == 2
    bad = register(client, run, 30).json()
    assert put_tar(client, bad["id"], TAR[: 9 * MIB]).status_code == 400
    assert len(keys(s3)) == 2  # the refused upload left no object
    key = f"prefix/{Checkpoint.objects.get(pk=older['id']).artifact.storage_key}"
    with django_capture_on_commit_callbacks(execute=True):
        assert api(admin).delete(f"/api/v1/checkpoints/{older['id']}/").status_code == 204
    assert key not in keys(s3) and len(keys(s3)) == 1
    assert Checkpoint.objects.get(pk=older["id"]).state == CheckpointState.DELETED
