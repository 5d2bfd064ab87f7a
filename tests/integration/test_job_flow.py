"""The end-to-end Job flow of tests/jobs/test_job_flow.py on PostgreSQL and a Redis broker.

A fresh PostgreSQL database (created beside the one ``MADO_DATABASE_URL`` names, dropped afterwards) holds
the deployment; gunicorn, the Celery worker (Redis at ``MADO_TEST_REDIS_URL``, a queue of its own so no
stale message of another test reaches it) and the Job's code all use it. Skips on a developer machine
without the services, fails under CI (tests/integration/conftest.py).
"""

from tests.jobs.test_job_flow import deployment, run_the_flow


def test_the_job_flow_on_postgresql_and_redis(postgres_url, redis_url, tmp_path):
    with deployment(tmp_path, MADO_DATABASE_URL=postgres_url, CELERY_BROKER_URL=redis_url) as site:
        run_the_flow(site, tmp_path)
        assert "transport:   redis://" in site.worker_log.read_text()
    import psycopg

    with psycopg.connect(postgres_url) as database:
        statuses = database.execute("SELECT kind, status FROM jobs_job ORDER BY id").fetchall()
    assert statuses == [("new", "failed"), ("resume", "succeeded")]
