"""The integration suite runs against real services: PostgreSQL (``MADO_DATABASE_URL``), Redis
(``MADO_TEST_REDIS_URL``) and an S3-compatible server (moto's server, started in-process).

``make test-integration`` sets both variables; ``.ci/run`` starts the services first. A test
skips only when its service is truly absent on a developer machine; under CI it fails instead.
"""

import os

import pytest
from django.db import connection


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


@pytest.fixture
def redis_url():
    url = os.environ.get("MADO_TEST_REDIS_URL")
    if url:
        import redis

        try:
            redis.Redis.from_url(url, socket_connect_timeout=2).ping()
        except redis.exceptions.ConnectionError:
            url = None
    require_service(bool(url), "Redis is not reachable at MADO_TEST_REDIS_URL")
    return url
