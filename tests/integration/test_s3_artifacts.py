"""Artifact upload, ranged download and delete against a real S3-compatible server (moto's, in-process).

The same API flows as ``tests/checkpoints/test_api_artifacts.py`` with
``storages["artifacts"]`` = django-storages ``S3Storage`` (docs/design/checkpoints.md#deletion;
docs/design/worker.md#fetch).
"""

import hashlib
import os

import pytest

from checkpoints.models import Artifact
from tests.integration.conftest import S3_BUCKET as BUCKET
from tests.integration.conftest import s3_keys as keys

BLOB = os.urandom(9 * 1024 * 1024 + 123)  # above boto3's 8 MiB multipart threshold
SHA = hashlib.sha256(BLOB).hexdigest()


def url(run, path="checkpoints/step-10.tar"):
    return f"/api/v1/runs/{run.pk}/artifacts/{path}"


def put(client, run, data=BLOB, **headers):
    return client.put(url(run), data=data, content_type="application/octet-stream", **headers)


def test_an_upload_is_streamed_into_the_bucket_under_a_fresh_key(s3_bucket, api, creator, run):
    response = put(api(creator), run, HTTP_X_MADO_SHA256=SHA)
    assert response.status_code == 201 and response.json()["sha256"] == SHA and response.json()["size"] == len(BLOB)
    artifact = Artifact.objects.get(run=run)
    assert keys(s3_bucket) == [f"prefix/{artifact.storage_key}"]
    stored = s3_bucket.get_object(Bucket=BUCKET, Key=f"prefix/{artifact.storage_key}")["Body"].read()
    assert hashlib.sha256(stored).hexdigest() == SHA


def test_downloads_use_ranged_gets_not_the_buffering_s3file(s3_bucket, api, creator, viewer, run, monkeypatch):
    assert put(api(creator), run).status_code == 201
    from storages.backends import s3

    monkeypatch.setattr(s3.S3File, "__init__", lambda *a, **k: pytest.fail("S3File buffers the whole object"))
    whole = api(viewer).get(url(run))
    assert whole.status_code == 200 and hashlib.sha256(b"".join(whole.streaming_content)).hexdigest() == SHA
    part = api(viewer).get(url(run), HTTP_RANGE="bytes=8388600-8388700")
    assert part.status_code == 206 and b"".join(part.streaming_content) == BLOB[8388600:8388701]
    assert part["Content-Range"] == f"bytes 8388600-8388700/{len(BLOB)}"
    tail = api(viewer).get(url(run), HTTP_RANGE="bytes=-10")
    assert b"".join(tail.streaming_content) == BLOB[-10:]


def test_the_same_content_is_idempotent_and_different_content_conflicts_without_new_objects(
    s3_bucket, api, creator, run
):
    client = api(creator)
    assert put(client, run).status_code == 201
    before = keys(s3_bucket)
    assert put(client, run).status_code == 200
    assert put(client, run, data=b"other bytes").status_code == 409
    assert keys(s3_bucket) == before


def test_a_digest_mismatch_keeps_no_object(s3_bucket, api, creator, run):
    response = put(api(creator), run, HTTP_X_MADO_SHA256="f" * 64)
    assert response.status_code == 400 and response.json()["field"] == "X-Mado-Sha256"
    assert keys(s3_bucket) == [] and not Artifact.objects.exists()


def test_an_admin_delete_removes_the_object_once_committed(
    s3_bucket, api, creator, admin, run, django_capture_on_commit_callbacks
):
    assert put(api(creator), run, data=b"small").status_code == 201
    with django_capture_on_commit_callbacks(execute=True):
        assert api(admin).delete(url(run)).status_code == 204
    assert keys(s3_bucket) == [] and not Artifact.objects.exists()
