"""The end-to-end Job flow of tests/jobs/test_job_flow.py on PostgreSQL and a Redis broker.

A fresh PostgreSQL database (created beside the one ``MADO_DATABASE_URL`` names, dropped afterwards) holds
the deployment; gunicorn, the Celery worker (Redis at ``MADO_TEST_REDIS_URL``, a queue of its own so no
stale message of another test reaches it) and the Job's code all use it. Skips on a developer machine
without the services, fails under CI (tests/integration/conftest.py).
"""

import os
import uuid
from urllib.parse import urlsplit

import pytest

from tests.integration.conftest import require_service
from tests.jobs.test_job_flow import deployment, run_the_flow


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


def test_the_job_flow_on_postgresql_and_redis(postgres_url, redis_url, tmp_path):
    with deployment(tmp_path, MADO_DATABASE_URL=postgres_url, CELERY_BROKER_URL=redis_url) as site:
        run_the_flow(site, tmp_path)
        assert "transport:   redis://" in site.worker_log.read_text()
    import psycopg

    with psycopg.connect(postgres_url) as database:
        statuses = database.execute("SELECT kind, status FROM jobs_job ORDER BY id").fetchall()
    assert statuses == [("new", "failed"), ("resume", "succeeded")]
