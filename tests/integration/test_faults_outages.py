"""Outages of the database, the storage and the disk, on a real deployment (gunicorn + a Celery worker).

PostgreSQL and the S3-compatible server (moto's) sit behind ``TcpProxy``s that the tests cut: every request
during a database outage answers 503 with ``Retry-After`` (JSON on API paths, never HTML; the 503 page on
pages); an S3 connection error during an upload answers 503 JSON; the SDK's checkpoint upload rides out a
60 s storage outage and completes. Disk full: the artifact volume is a 64 MiB tmpfs (mounted here, as root)
and a 100 MiB checkpoint gets 507, the reason is recorded on the checkpoint and the SDK sends the body once.
"""

import logging
import os
import subprocess
import threading
import time
import uuid
from urllib.parse import urlsplit

import boto3
import pytest
import requests

import mado_tracking
from mado_tracking.errors import CheckpointError
from tests.deployment import deployment
from tests.integration.conftest import require_service

MIB = 1024 * 1024
UNAVAILABLE_DB = {"error": "unavailable", "detail": "database unavailable, retry", "field": None}
UNAVAILABLE_S3 = {"error": "unavailable", "detail": "storage unavailable, retry", "field": None}


def s3_variables(endpoint: str, bucket: str) -> dict[str, str]:
    return {
        "MADO_STORAGE": "s3",
        "MADO_S3_ENDPOINT_URL": endpoint,
        "MADO_S3_BUCKET": bucket,
        "MADO_S3_REGION": "us-east-1",
        "MADO_S3_ACCESS_KEY_ID": "testing",
        "MADO_S3_SECRET_ACCESS_KEY": "testing",
        "MADO_CHECKPOINT_PART_SIZE": str(8 * MIB),
    }


@pytest.fixture
def bucket(moto_endpoint):
    """A fresh bucket on moto's server; yields ``(client, name)``."""
    client = boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    name = f"outage-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=name)
    yield client, name


@pytest.fixture
def site(tmp_path, postgres_url, redis_url, moto_endpoint, bucket, tcp_proxy):
    """A deployment on PostgreSQL, Redis and S3, the database and S3 each behind a proxy: ``(site, db, s3)``."""
    database = urlsplit(postgres_url)
    db_proxy = tcp_proxy(database.hostname, database.port or 5432)
    s3 = urlsplit(moto_endpoint)
    s3_proxy = tcp_proxy(s3.hostname, s3.port)
    via_proxy = database._replace(netloc=f"{database.username or 'postgres'}@127.0.0.1:{db_proxy.port}").geturl()
    variables = s3_variables(f"http://127.0.0.1:{s3_proxy.port}", bucket[1])
    with deployment(tmp_path, MADO_DATABASE_URL=via_proxy, CELERY_BROKER_URL=redis_url, **variables) as running:
        yield running, db_proxy, s3_proxy


def checkpoint_dir(tmp_path, size: int):
    """A checkpoint directory holding one file of ``size`` random bytes."""
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "model.pt").write_bytes(os.urandom(size))
    return directory


def bearer(site) -> dict[str, str]:
    return {"Authorization": f"Bearer {site.token}"}


def page_session(site) -> requests.Session:
    """A browser-like session logged in as user ``flow``."""
    session = requests.Session()
    session.get(f"{site.url}/accounts/login/", timeout=10)
    answer = session.post(
        f"{site.url}/accounts/login/",
        timeout=10,
        allow_redirects=False,
        data={"username": "flow", "password": "flow-password", "csrfmiddlewaretoken": session.cookies["csrftoken"]},
    )
    assert answer.status_code == 302, answer.text[:300]
    return session


def assert_json_503(response, body):
    assert response.status_code == 503, f"{response.request.method} {response.url}: {response.text[:300]}"
    assert response.headers["Content-Type"] == "application/json" and int(response.headers["Retry-After"]) > 0
    assert "<" not in response.text and response.json() == body


def test_every_request_during_a_database_outage_answers_503_json_or_the_503_page(site):
    site, db_proxy, _ = site
    api = requests.Session()
    api.headers.update(bearer(site))
    run = api.post(f"{site.url}/api/v1/runs/", json={"project": "flow", "name": "before"}, timeout=10).json()
    pages = page_session(site)
    v1 = f"{site.url}/api/v1"
    api_requests = [
        ("GET", f"{v1}/runs/", None),
        ("POST", f"{v1}/runs/", {"project": "flow"}),
        ("GET", f"{v1}/runs/{run['id']}/", None),
        ("PATCH", f"{v1}/runs/{run['id']}/", {"status": "finished"}),
        ("POST", f"{v1}/runs/{run['id']}/metrics/", {"points": [{"key": "loss", "value": 0.5, "step": 1}]}),
        ("POST", f"{v1}/runs/{run['id']}/heartbeat/", {}),
        ("GET", f"{v1}/projects/", None),
        ("GET", f"{v1}/jobs/", None),
        ("POST", f"{v1}/runs/{run['id']}/checkpoints/", {"step": 1}),
    ]
    mlflow = [
        ("GET", f"{site.url}/api/2.0/mlflow/experiments/search?max_results=5"),
        ("GET", f"{site.url}/api/2.0/mlflow/runs/get?run_id=1"),
        ("GET", f"{site.url}/api/2.0/mlflow-artifacts/artifacts?path=1"),
        ("GET", f"{site.url}/mlflow/api/2.0/mlflow/experiments/search"),
    ]
    with db_proxy.outage():
        for method, url, body in api_requests:
            assert_json_503(api.request(method, url, json=body, timeout=30), UNAVAILABLE_DB)
        assert_json_503(
            requests.put(
                f"{v1}/runs/{run['id']}/artifacts/notes.txt", data=b"x" * MIB, headers=bearer(site), timeout=30
            ),
            UNAVAILABLE_DB,
        )
        for method, url in mlflow:
            assert_json_503(
                api.request(method, url, timeout=30),
                {"error_code": "TEMPORARILY_UNAVAILABLE", "message": "database unavailable, retry"},
            )
        for url in (
            f"{site.url}/",
            f"{site.url}/runs/{run['id']}/",
            f"{site.url}/projects/flow/",
            f"{site.url}/accounts/login/",
        ):
            page = pages.get(url, timeout=30)
            assert page.status_code == 503 and page.headers["Retry-After"], url
            assert "Temporarily unavailable" in page.text and "接続できません" in page.text
    deadline = time.monotonic() + 30
    while api.get(f"{v1}/runs/{run['id']}/", timeout=10).status_code != 200:  # back once the database is
        assert time.monotonic() < deadline, "the API did not recover within 30 s of the database"
        time.sleep(0.5)
    assert pages.get(f"{site.url}/runs/{run['id']}/", timeout=10).status_code == 200


def test_an_s3_connection_error_during_an_upload_answers_503_json(site):
    site, _, s3_proxy = site
    api = requests.Session()
    api.headers.update(bearer(site))
    run = api.post(f"{site.url}/api/v1/runs/", json={"project": "flow", "name": "s3"}, timeout=10).json()
    checkpoint = api.post(f"{site.url}/api/v1/runs/{run['id']}/checkpoints/", json={"step": 1}, timeout=10).json()
    body = os.urandom(3 * MIB)
    with s3_proxy.outage():
        answers = [
            api.put(f"{site.url}/api/v1/runs/{run['id']}/artifacts/weights.bin", data=body, timeout=120),
            api.put(
                f"{site.url}/api/v1/checkpoints/{checkpoint['id']}/tar",
                data=body,
                timeout=120,
                headers={"Content-Type": "application/x-tar"},
            ),
            api.post(
                f"{site.url}/api/v1/checkpoints/{checkpoint['id']}/upload-parts/",
                json={"tar_size": 9 * MIB},
                timeout=120,
            ),
        ]
        for answer in answers:
            assert_json_503(answer, UNAVAILABLE_S3)
    stored = api.put(f"{site.url}/api/v1/runs/{run['id']}/artifacts/weights.bin", data=body, timeout=120)
    assert stored.status_code in (200, 201), stored.text[:300]


def test_the_sdks_checkpoint_upload_survives_a_60_s_storage_outage(site, bucket, tmp_path, monkeypatch, caplog):
    site, _, s3_proxy = site
    s3_client, bucket_name = bucket
    ckpt = checkpoint_dir(tmp_path, 20 * MIB)  # three 8 MiB parts
    outage = {}
    put = requests.Session.put

    def storage_fails_at_the_first_part(session, url, data=None, **kwargs):
        if "partNumber=" in url and not outage:  # the outage starts as the first part goes out
            outage["started"] = time.monotonic()
            s3_proxy.cut()
            timer = threading.Timer(60.0, lambda: (outage.update(ended=time.monotonic()), s3_proxy.restore()))
            timer.daemon = True
            timer.start()
        return put(session, url, data=data, **kwargs)

    monkeypatch.setattr(requests.Session, "put", storage_fails_at_the_first_part)
    with caplog.at_level(logging.WARNING, logger="mado_tracking"):
        with mado_tracking.start_run(project="flow", api_url=site.url, api_token=site.token) as run:
            saved = run.log_checkpoint(ckpt, step=20)
    assert outage["ended"] - outage["started"] >= 60.0
    resource = requests.get(f"{site.url}/api/v1/checkpoints/{saved.id}/", headers=bearer(site), timeout=10).json()
    assert resource["state"] == "complete" and resource["tar_sha256"] == saved.sha256
    assert s3_client.list_multipart_uploads(Bucket=bucket_name).get("Uploads", []) == []
    assert any("still failing after" in record.getMessage() for record in caplog.records)


@pytest.fixture
def small_volume(tmp_path):
    """A 64 MiB tmpfs at ``tmp_path/data/artifacts`` (the deployment's artifact storage); unmounted afterwards."""
    target = tmp_path / "data" / "artifacts"
    target.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(target)], capture_output=True, text=True
    )
    require_service(mounted.returncode == 0, f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
    yield target
    subprocess.run(["umount", "-l", str(target)], check=False)


def test_a_checkpoint_larger_than_the_free_space_gets_507_and_is_sent_once(small_volume, tmp_path, monkeypatch):
    ckpt = checkpoint_dir(tmp_path, 100 * MIB)
    tar_puts = []
    put = requests.Session.put

    def counting_put(session, url, data=None, **kwargs):
        tar_puts.extend([url] if url.endswith("/tar") else [])
        return put(session, url, data=data, **kwargs)

    monkeypatch.setattr(requests.Session, "put", counting_put)
    with deployment(tmp_path) as site:
        with mado_tracking.start_run(project="flow", api_url=site.url, api_token=site.token) as run:
            with pytest.raises(CheckpointError, match="no space left on the artifact storage"):
                run.log_checkpoint(ckpt, step=100)
        listed = requests.get(
            f"{site.url}/api/v1/runs/{run.id}/checkpoints/?all=1", headers=bearer(site), timeout=10
        ).json()["results"]
        assert [c["state"] for c in listed] == ["pending"] and "ran out of space" in listed[0]["error"]
        tab = page_session(site).get(f"{site.url}/runs/{run.id}/checkpoints/", timeout=10).text
        assert "ran out of space" in tab
    assert len(tar_puts) == 1  # the 100 MiB body went once, not once per retry
    assert [path for path in small_volume.rglob("*") if path.is_file()] == []  # no partial blob left behind


@pytest.fixture
def broker_site(tmp_path, redis_url, tcp_proxy):
    """A deployment whose Redis broker sits behind a proxy the test cuts: ``(site, broker proxy)``."""
    broker = urlsplit(redis_url)
    proxy = tcp_proxy(broker.hostname, broker.port or 6379)
    via_proxy = broker._replace(netloc=f"127.0.0.1:{proxy.port}").geturl()
    with deployment(tmp_path, CELERY_BROKER_URL=via_proxy) as running:
        yield running, proxy


def test_a_dead_broker_never_holds_a_request_that_sends_a_message(broker_site, tmp_path):
    """A launch queues its Job's message: with the broker down the message waits in the outbox and the answer
    comes at once (docs/deploy.md, "Messages and outages")."""
    site, broker = broker_site
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('ok')\n")
    pushed = site.mado(
        "code",
        "push",
        tmp_path / "code",
        "--project",
        "flow",
        "--name",
        "quick",
        "-q",
        "--entrypoint",
        "python train.py",
    )
    assert pushed.exit_code == 0, pushed.output
    code_version = pushed.output.strip().splitlines()[-1]
    launch = ["job", "launch", "--project", "flow", "--code-version", code_version, "--queue", site.queue]
    started = time.monotonic()
    assert site.mado(*launch).exit_code == 0  # with the broker up: what a launch takes on this machine now
    usual = time.monotonic() - started
    with broker.outage():
        started = time.monotonic()
        launched = site.mado(*launch)
        took = time.monotonic() - started
    assert launched.exit_code == 0, launched.output
    # Compared with the launch just before, not with a fixed deadline a loaded machine misses: a send that waited
    # for the broker would add at least its 2 s connect timeout.
    assert took < usual + 2.0, f"the launch took {took:.1f} s while the broker was down ({usual:.1f} s when up)"
