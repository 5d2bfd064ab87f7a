"""The operators' endpoints on a real deployment (gunicorn + a Celery worker on PostgreSQL, Redis and moto's S3,
each behind a ``TcpProxy``; docs/deploy.md#health-and-metrics): ``/readyz`` answers 503 JSON naming the database,
the broker or the storage while that one is cut and 200 once it is back, ``/healthz`` stays 200 throughout; and
``/metrics`` (gunicorn's two processes counted together) parses with the Prometheus client's parser and moves
when a Job runs: the Job appears by queue and state, its metric points are counted, its requests are timed.
"""

import shlex
import time
from urllib.parse import urlsplit

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.deployment import ROOT, deployment
from tests.integration.test_faults_outages import bucket, s3_variables  # noqa: F401 - fixture

READY = {"database": "ok", "broker": "ok", "storage": "ok"}


@pytest.fixture
def site(tmp_path, postgres_url, redis_url, moto_endpoint, bucket, tcp_proxy):  # noqa: F811
    """A deployment whose database, broker and storage each sit behind a proxy: ``(site, {component: proxy})``."""
    database, broker, s3 = urlsplit(postgres_url), urlsplit(redis_url), urlsplit(moto_endpoint)
    proxies = {
        "database": tcp_proxy(database.hostname, database.port or 5432),
        "broker": tcp_proxy(broker.hostname, broker.port or 6379),
        "storage": tcp_proxy(s3.hostname, s3.port),
    }
    variables = {
        **s3_variables(f"http://127.0.0.1:{proxies['storage'].port}", bucket[1]),
        "MADO_DATABASE_URL": database._replace(netloc=f"postgres@127.0.0.1:{proxies['database'].port}").geturl(),
        "CELERY_BROKER_URL": broker._replace(netloc=f"127.0.0.1:{proxies['broker'].port}").geturl(),
        "MADO_READYZ_TIMEOUT_S": "2",
    }
    with deployment(tmp_path, **variables) as running:
        yield running, proxies


def readyz(site) -> tuple[int, dict]:
    answer = requests.get(f"{site.url}/readyz", timeout=15)
    assert answer.headers["Content-Type"] == "application/json", answer.text[:300]
    return answer.status_code, answer.json()


def test_readyz_names_each_component_while_it_is_cut_and_recovers(site):
    site, proxies = site
    assert readyz(site) == (200, {"status": "ready", "components": READY})
    for component, proxy in proxies.items():
        with proxy.outage():
            status, body = readyz(site)
            assert (status, body["status"]) == (503, "unavailable"), body
            assert [name for name, state in body["components"].items() if state != "ok"] == [component], body
            assert requests.get(f"{site.url}/healthz", timeout=5).json() == {"status": "ok"}
        deadline = time.monotonic() + 30
        while readyz(site)[0] != 200:
            assert time.monotonic() < deadline, f"/readyz still {readyz(site)} after {component} came back"
            time.sleep(0.5)
        assert readyz(site) == (200, {"status": "ready", "components": READY})


def scrape(site) -> dict[tuple[str, tuple], float]:
    answer = requests.get(f"{site.url}/metrics", timeout=15)
    assert answer.status_code == 200, answer.text[:300]
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def test_metrics_move_when_a_job_runs(tmp_path, postgres_url, redis_url):
    (tmp_path / "prometheus").mkdir()
    variables = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prometheus")}
    with deployment(tmp_path, MADO_DATABASE_URL=postgres_url, CELERY_BROKER_URL=redis_url, **variables) as site:
        run_a_job_and_check_the_metrics(site)


def run_a_job_and_check_the_metrics(site):
    job_state = ("mado_jobs", (("queue", site.queue), ("state", "succeeded")))
    points = ("mado_metric_points_ingested_total", ())
    before = scrape(site)
    assert job_state not in before
    entrypoint = shlex.join(["python", "training.py", "--steps", "12", "--checkpoint-every", "10"])
    pushed = site.mado(
        "code", "push", ROOT / "examples", "--project", "flow", "--name", "ex", "--entrypoint", entrypoint
    )
    assert pushed.exit_code == 0, pushed.output
    launched = site.mado("job", "launch", "--project", "flow", "--code-version", "ex:1", "--queue", site.queue, "-q")
    assert launched.exit_code == 0, launched.output
    followed = site.mado("job", "logs", int(launched.output), "--follow", "--interval", "0.3", "--timeout", "300")
    assert followed.exit_code == 0, f"{followed.output}\n{site.logs()}"
    after = scrape(site)
    assert after[job_state] == 1
    # two keys, twelve steps: 24 points, whichever gunicorn process stored them
    assert after[points] - before.get(points, 0) == 24
    posts = (
        "mado_http_request_duration_seconds_count",
        (("method", "POST"), ("status", "2xx"), ("view", "api:run-metrics")),
    )
    assert after[posts] - before.get(posts, 0) >= 1  # the Job's SDK posted its points
    assert after[("mado_outbox_backlog", (("state", "unsent"),))] == 0
