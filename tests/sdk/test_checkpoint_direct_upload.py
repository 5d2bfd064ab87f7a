"""``log_checkpoint`` with S3 storage (``direct_upload``): presigned parts straight to the bucket, one part held
at a time, then the verification task (docs/design/checkpoints.md#a-checkpoint; docs/api.md "Checkpoints"). S3 is moto's
server, in-process."""

import hashlib
import os
import time
from urllib.parse import urlsplit

import pytest
import requests

import mado_tracking
from checkpoints.models import Checkpoint, CheckpointState
from mado_tracking import checkpoints as checkpoints_module
from mado_tracking.errors import CheckpointError

pytestmark = pytest.mark.django_db(transaction=True)
moto_server = pytest.importorskip("moto.server")

BUCKET = "mado-sdk-test"
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def moto_endpoint():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(moto_endpoint, settings, monkeypatch):
    """S3 artifact storage with 8 MiB parts; the verification task runs when the SDK waits between polls."""
    import boto3
    from celery import current_app

    from worker import tasks

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    client = boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=BUCKET)
    storage = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": BUCKET,
            "endpoint_url": moto_endpoint,
            "region_name": "us-east-1",
            "access_key": "testing",
            "secret_key": "testing",
            "location": "prefix",
            "file_overwrite": False,
            "default_acl": None,
        },
    }
    settings.STORAGES = {**settings.STORAGES, "default": storage, "artifacts": storage}
    settings.MADO_CHECKPOINT_PART_SIZE = 8 * MIB
    queued = []
    monkeypatch.setattr(current_app, "send_task", lambda name, args=(), **options: queued.append(args))
    sleep = checkpoints_module.time.sleep

    def sleep_then_verify(seconds):
        while queued:
            tasks.checkpoint_verify.apply(args=queued.pop(0))
        sleep(min(seconds, 0.01))

    monkeypatch.setattr(checkpoints_module.time, "sleep", sleep_then_verify)
    yield client
    for item in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=item["Key"])
    for upload in client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []):
        client.abort_multipart_upload(Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"])
    client.delete_bucket(Bucket=BUCKET)


@pytest.mark.parametrize("wait", [True, False])
def test_a_checkpoint_goes_to_the_bucket_in_parts_and_completes_after_verification(
    mmt_env, s3, tmp_path, monkeypatch, wait
):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.pt").write_bytes(os.urandom(17 * MIB + 5))
    (ckpt / "optim.pt").write_bytes(b"o" * 1000)
    part_sizes, through_server = [], []
    put = requests.Session.put

    def spy(session, url, data=None, **kwargs):
        (through_server if "/api/v1/" in url else part_sizes).append(len(data))
        return put(session, url, data=data, **kwargs)

    monkeypatch.setattr(requests.Session, "put", spy)
    with mado_tracking.start_run() as run:
        saved = run.log_checkpoint(ckpt, step=10, framework="torch", wait=wait)
    saved = saved if wait else saved.result(timeout=0)  # a background save is complete once the run finished
    assert through_server == []
    assert part_sizes[:2] == [8 * MIB, 8 * MIB] and len(part_sizes) == 3  # 17 MiB + tar headers
    stored = Checkpoint.objects.get(pk=saved.id)
    assert stored.state == CheckpointState.COMPLETE and stored.tar_sha256 == saved.sha256
    assert list(stored.manifest.order_by("path").values_list("path", "sha256")) == [
        ("model.pt", hashlib.sha256((ckpt / "model.pt").read_bytes()).hexdigest()),
        ("optim.pt", hashlib.sha256(b"o" * 1000).hexdigest()),
    ]
    body = requests.get(
        f"{mmt_env['MMT_API_URL']}/api/v1/checkpoints/{saved.id}/tar",
        headers={"Authorization": f"Bearer {mmt_env['MMT_API_TOKEN']}"},
        timeout=60,
    ).content
    assert hashlib.sha256(body).hexdigest() == saved.sha256


def test_a_failed_part_is_sent_again(mmt_env, s3, tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoints_module, "BACKOFF_BASE_S", 0.01)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.pt").write_bytes(os.urandom(9 * MIB))
    attempts = []
    put = requests.Session.put

    def cut_second_part_once(session, url, data=None, **kwargs):
        if "partNumber=2" in url:
            attempts.append(url)
            if len(attempts) == 1:
                raise requests.ConnectionError("cut by the test")
        return put(session, url, data=data, **kwargs)

    monkeypatch.setattr(requests.Session, "put", cut_second_part_once)
    with mado_tracking.start_run() as run:
        saved = run.log_checkpoint(ckpt, step=1)
    assert len(attempts) == 2
    assert Checkpoint.objects.get(pk=saved.id).state == CheckpointState.COMPLETE


def test_presigned_urls_name_the_public_s3_address_when_one_is_set(mmt_env, s3, moto_endpoint, settings, tmp_path):
    public = moto_endpoint.replace("127.0.0.1", "localhost")  # the same server under the name clients use
    settings.MADO_S3_PUBLIC_ENDPOINT_URL = public
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.pt").write_bytes(os.urandom(9 * MIB))
    hosts = []
    put = requests.Session.put

    def spy(session, url, data=None, **kwargs):
        hosts.append(urlsplit(url).netloc)
        return put(session, url, data=data, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(requests.Session, "put", spy)
        with mado_tracking.start_run() as run:
            saved = run.log_checkpoint(ckpt, step=1)
    assert hosts == [urlsplit(public).netloc] * 2  # two parts, both to the public name
    assert Checkpoint.objects.get(pk=saved.id).state == CheckpointState.COMPLETE


def test_a_presigned_host_that_does_not_resolve_fails_soon_naming_the_host_and_the_setting(
    mmt_env, s3, settings, tmp_path, monkeypatch
):
    settings.MADO_S3_PUBLIC_ENDPOINT_URL = "http://minio.invalid:9000"  # .invalid never resolves (RFC 2606)
    monkeypatch.setenv("MMT_RETRY_TIMEOUT", "600")  # not what ends it
    monkeypatch.setattr(checkpoints_module, "STORAGE_UNREACHABLE_S", 0.5)
    monkeypatch.setattr(checkpoints_module, "BACKOFF_BASE_S", 0.01)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.pt").write_bytes(b"m" * 1000)
    began = time.monotonic()
    with mado_tracking.start_run() as run:
        with pytest.raises(CheckpointError) as refused:
            run.log_checkpoint(ckpt, step=1)
    assert time.monotonic() - began < 60
    message = str(refused.value)
    assert "object storage at minio.invalid:9000" in message and "MADO_S3_PUBLIC_ENDPOINT_URL" in message
    assert Checkpoint.objects.get(run__external_id=run.external_id, step=1).state != CheckpointState.COMPLETE
