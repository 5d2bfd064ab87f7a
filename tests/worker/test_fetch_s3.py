"""Fetching from S3 (django-storages' S3Storage, moto in process): ranged GETs, and a broken body resumed
with a ``Range`` from the byte reached (docs/design/worker.md#fetch)."""

import os

import boto3
import pytest
from moto import mock_aws

from checkpoints import storage
from tests.worker.helpers import make_tar, stored_checkpoint
from worker.errors import CheckpointMismatch
from worker.fetch import CHUNK_SIZE, restore_checkpoint

pytestmark = pytest.mark.django_db
BUCKET = "mado-worker-test"
BIG = {"model.pt": os.urandom(2 * CHUNK_SIZE + 999), "rng.bin": b"r" * 10}


@pytest.fixture
def s3(settings, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
        client.create_bucket(Bucket=BUCKET)
        backend = {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": BUCKET,
                "region_name": "us-east-1",
                "access_key": "k",
                "secret_key": "s",
                "location": "prefix",
                "file_overwrite": False,
                "default_acl": None,
            },
        }
        settings.STORAGES = {**settings.STORAGES, "default": backend, "artifacts": backend}
        yield client


def test_a_checkpoint_in_s3_is_fetched_and_a_broken_body_resumes_with_a_range(s3, run, tmp_path, monkeypatch):
    checkpoint = stored_checkpoint(run, 10, BIG)
    assert s3.list_objects_v2(Bucket=BUCKET)["KeyCount"] == 1
    real, ranges = storage._s3_range, []

    def s3_range(backend, key, start, length, chunk_size):
        ranges.append((start, start + length - 1))
        body = real(backend, key, start, length, chunk_size)
        if len(ranges) > 1:
            return body

        def broken():
            yield next(body)
            body.close()
            raise ConnectionResetError("connection reset by S3")

        return broken()

    monkeypatch.setattr(storage, "_s3_range", s3_range)
    restored = restore_checkpoint(checkpoint=checkpoint, workdir=tmp_path, backoff_s=0)
    size = len(make_tar(BIG))
    assert ranges == [(0, size - 1), (CHUNK_SIZE, size - 1)]
    assert {p.name: p.read_bytes() for p in restored.checkpoint_dir.iterdir()} == BIG


def test_a_missing_s3_object_is_an_artifact_mismatch(s3, run, tmp_path):
    checkpoint = stored_checkpoint(run, 10)
    s3.delete_object(Bucket=BUCKET, Key=f"prefix/{checkpoint.artifact.storage_key}")
    with pytest.raises(CheckpointMismatch, match=f"Checkpoint {checkpoint.pk} artifact mismatch: object missing"):
        restore_checkpoint(checkpoint=checkpoint, workdir=tmp_path, backoff_s=0)


def test_a_long_s3_range_is_read_as_parallel_ranged_gets_and_a_failed_part_resumes(s3, run, tmp_path, monkeypatch):
    """Parts of 300,000 bytes, four in flight; the fifth part fails once: the restore resumes at its first byte."""
    from botocore.client import BaseClient

    checkpoint = stored_checkpoint(run, 10, BIG)
    monkeypatch.setattr(storage, "S3_RANGE_PART", 300_000)
    real, ranges = BaseClient._make_api_call, []

    def recording(client, operation, params):
        if operation == "GetObject":
            ranges.append(params["Range"])
            if params["Range"].startswith("bytes=1200000-") and ranges.count(params["Range"]) == 1:
                raise ConnectionResetError("connection reset by S3")
        return real(client, operation, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", recording)
    restored = restore_checkpoint(checkpoint=checkpoint, workdir=tmp_path, backoff_s=0)
    assert {p.name: p.read_bytes() for p in restored.checkpoint_dir.iterdir()} == BIG
    size = len(make_tar(BIG))
    assert ranges[0] == "bytes=0-299999"  # read before the parts in flight are started
    assert set(ranges[1:5]) == {
        "bytes=300000-599999",
        "bytes=600000-899999",
        "bytes=900000-1199999",
        "bytes=1200000-1499999",
    }
    assert f"bytes=1200000-{min(1499999, size - 1)}" in ranges[5:], "the failed part is read again from its first byte"
