"""The integration suite runs against real services: PostgreSQL (``MADO_DATABASE_URL``), Redis
(``MADO_TEST_REDIS_URL``) and an S3-compatible server (moto's server, started in-process).

``make test-integration`` sets both variables; ``.ci/run`` starts the services first. A test
skips only when its service is truly absent on a developer machine; under CI it fails instead.
"""

import os
import uuid
from urllib.parse import urlsplit

import boto3
import pytest
from django.db import connection

from tests.integration.tcp_proxy import tcp_proxy  # noqa: F401 - fixture for fault tests

S3_BUCKET = "mado-test"


def require_service(available: bool, reason: str) -> None:
    """Skip (developer machine) or fail (CI) when a real service is not reachable."""
    if available:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must provide it: .ci/run starts the services)")
    pytest.skip(reason)


@pytest.fixture
def postgres(db):
    require_service(connection.vendor == "postgresql", "MADO_DATABASE_URL does not point at PostgreSQL")
    return connection


def worker_redis_url(url: str) -> str:
    """``url`` with a Redis database of this pytest-xdist worker's own: ``gw0`` keeps the database the URL names,
    ``gw1`` the one below it, and so on (Redis has 16), so one worker's Celery queues and broadcasts never reach
    another worker's processes."""
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    if index >= 16:
        pytest.fail(f"pytest-xdist worker gw{index}: Redis has 16 databases, one per worker (make TEST_WORKERS=8)")
    parts = urlsplit(url)
    database = int(parts.path.strip("/") or 0)
    return parts._replace(path=f"/{(database - index) % 16}").geturl()


@pytest.fixture
def redis_url():
    url = os.environ.get("MADO_TEST_REDIS_URL")
    if url:
        url = worker_redis_url(url)
        import redis

        try:
            redis.Redis.from_url(url, socket_connect_timeout=2).ping()
        except redis.exceptions.ConnectionError:
            url = None
    require_service(bool(url), "Redis is not reachable at MADO_TEST_REDIS_URL")
    return url


@pytest.fixture(scope="session")
def moto_endpoint():
    """URL of moto's S3-compatible server, started in this process on a free port."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(moto_endpoint, settings, monkeypatch):
    """``storages["artifacts"]`` is an S3Storage on a fresh bucket ``S3_BUCKET``; yields a boto3 client on it."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    client = boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=S3_BUCKET)
    storage = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": S3_BUCKET,
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
    yield client
    for upload in client.list_multipart_uploads(Bucket=S3_BUCKET).get("Uploads", []):
        client.abort_multipart_upload(Bucket=S3_BUCKET, Key=upload["Key"], UploadId=upload["UploadId"])
    for item in client.list_objects_v2(Bucket=S3_BUCKET).get("Contents", []):
        client.delete_object(Bucket=S3_BUCKET, Key=item["Key"])
    client.delete_bucket(Bucket=S3_BUCKET)


def s3_keys(client) -> list[str]:
    """The object keys in the test bucket, sorted."""
    return sorted(item["Key"] for item in client.list_objects_v2(Bucket=S3_BUCKET).get("Contents", []))


@pytest.fixture
def postgres_url():
    """The URL of a new, empty PostgreSQL database on the server of ``MADO_DATABASE_URL``; dropped afterwards."""
    import psycopg
    from psycopg import sql

    url = os.environ.get("MADO_DATABASE_URL", "")
    reachable = url.startswith(("postgres://", "postgresql://"))
    if reachable:
        try:
            psycopg.connect(url, connect_timeout=3, autocommit=True).close()
        except psycopg.OperationalError:
            reachable = False
    require_service(reachable, "MADO_DATABASE_URL does not point at a reachable PostgreSQL")
    name = f"mado_flow_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield urlsplit(url)._replace(path=f"/{name}").geturl()
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
