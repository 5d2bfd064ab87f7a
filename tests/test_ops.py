"""The operators' endpoints on the embedded default (docs/deploy.md#health-and-metrics, #logs): liveness and
readiness answer probes that send a pod's address as Host over plain HTTP, /metrics parses with the Prometheus
client's parser and answers only a caller with the token or from an allowed network, every answer carries its
request id, and JSON logs carry it too. The outages of each component: tests/integration/test_ops_outages.py."""

import json
import os
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.django_db
def test_probes_answer_a_pod_address_over_plain_http_even_with_https_redirects(client, settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.ALLOWED_HOSTS = ["mado.example.com"]
    assert client.get("/healthz", HTTP_HOST="10.1.2.3:8000").json() == {"status": "ok"}
    ready = client.get("/readyz", HTTP_HOST="10.1.2.3:8000")
    assert ready.status_code == 200, ready.content
    assert ready.json() == {"status": "ready", "components": {"database": "ok", "broker": "ok", "storage": "ok"}}
    # any other path keeps the host check and the redirect
    assert client.get("/accounts/login/", HTTP_HOST="10.1.2.3:8000").status_code == 400


@pytest.mark.django_db
def test_readyz_names_a_component_that_fails(client, monkeypatch):
    from config import ops

    def broker_down():
        raise ConnectionRefusedError("[Errno 111] Connection refused")

    monkeypatch.setitem(ops.CHECKS, "broker", broker_down)
    answer = client.get("/readyz")
    assert answer.status_code == 503
    assert answer.json() == {
        "status": "unavailable",
        "components": {
            "database": "ok",
            "broker": "ConnectionRefusedError: [Errno 111] Connection refused",
            "storage": "ok",
        },
    }


@pytest.mark.django_db
def test_metrics_parse_and_count_requests_jobs_and_points(client, django_capture_on_commit_callbacks):
    from jobs.models import Queue
    from runs.metrics import metrics_ingest
    from runs.models import Role
    from tests.factories import MembershipFactory, RunFactory

    Queue.objects.get_or_create(name="gpu-a100")
    client.get("/accounts/login/")
    run = RunFactory()
    MembershipFactory(user=run.created_by, project=run.project, role=Role.MEMBER)
    before = samples(client.get("/metrics").content.decode()).get(("mado_metric_points_ingested_total", ()), 0)
    points = [{"key": key, "value": 0.5, "step": step} for key in ("loss", "accuracy") for step in range(125)]
    with django_capture_on_commit_callbacks(execute=True):
        metrics_ingest(actor=run.created_by, run=run, points=points)
    answer = client.get("/metrics")
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/plain")
    found = samples(answer.content.decode())
    assert (
        found[("mado_http_request_duration_seconds_count", (("method", "GET"), ("status", "2xx"), ("view", "login")))]
        >= 1
    )
    assert found[("mado_metric_points_ingested_total", ())] - before == 250
    assert found[("mado_queue_depth", (("queue", "gpu-a100"),))] == 0
    assert found[("mado_outbox_backlog", (("state", "unsent"),))] == 0


@pytest.mark.django_db
def test_metrics_refuse_a_caller_without_the_token_outside_the_allowed_networks(client, settings):
    import ipaddress

    settings.MADO_METRICS_TOKEN = "scrape-secret"
    settings.MADO_METRICS_ALLOW_FROM = (ipaddress.ip_network("10.0.0.0/8"),)
    outside = {"REMOTE_ADDR": "192.0.2.7"}
    refused = client.get("/metrics", **outside)
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong", **outside).status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret", **outside).status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="10.20.30.40").status_code == 200


@pytest.mark.django_db
def test_each_answer_carries_its_request_id_and_json_logs_write_it(client, caplog):
    offered = client.get("/healthz", HTTP_X_REQUEST_ID="lb-1234.abc")
    assert offered["X-Request-ID"] == "lb-1234.abc"
    made = client.get("/healthz", HTTP_X_REQUEST_ID="bad id with spaces")
    assert made["X-Request-ID"] != "bad id with spaces" and len(made["X-Request-ID"]) == 32


def test_json_logs_write_one_object_per_line_with_the_request_id(tmp_path):
    code = (
        "import django, logging; django.setup(); from mado import logs; logs._current.set('req-42'); "
        "logging.getLogger('mado.test').warning('stored %d points', 3)"
    )
    env = {
        **os.environ,
        "MADO_LOG_FORMAT": "json",
        "MADO_DATA_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    line = json.loads(done.stderr.strip().splitlines()[-1])
    assert (line["level"], line["logger"], line["message"], line["request_id"]) == (
        "WARNING",
        "mado.test",
        "stored 3 points",
        "req-42",
    )
    assert "time" in line


def test_the_image_web_command_writes_gunicorns_own_lines_as_json_too(tmp_path):
    """``deploy/entrypoint.sh web`` with ``MADO_LOG_FORMAT=json``: every line gunicorn writes (start, workers, each
    request) is one JSON object, so a log pipeline parses the web's output whole (docs/deploy.md#logs)."""
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
        "MADO_LOG_FORMAT": "json",
        "MADO_DATA_DIR": str(tmp_path),
        "MADO_SECRET_KEY": "x" * 50,
        "MADO_BIND": f"127.0.0.1:{port}",
        "MADO_WEB_WORKERS": "1",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
    }
    web = subprocess.Popen(
        ["sh", "deploy/entrypoint.sh", "web"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline, answer, probes = time.monotonic() + 60, None, 0
        while answer is None and time.monotonic() < deadline and web.poll() is None:
            probes += 1  # each probe its own id: one answered after its own 5 s timeout shows up as itself
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/healthz", headers={"X-Request-ID": f"lb-{probes}"}
            )
            try:
                answer = urllib.request.urlopen(request, timeout=5).status
            except OSError:
                time.sleep(0.2)
        assert answer == 200
    finally:
        web.send_signal(signal.SIGTERM)
        out, err = web.communicate(timeout=60)
    lines = [json.loads(line) for line in (out + err).splitlines() if line.strip()]
    messages = {(line["logger"], line["message"].split(":")[0]) for line in lines}
    assert ("gunicorn.error", "Listening at") in messages and ("gunicorn.error", "Booting worker with pid") in messages
    # one line per request that reached the web, the answered probe's among them
    access = [(a["status"], a["request_id"], a["message"]) for a in lines if a["logger"] == "gunicorn.access"]
    answered = (200, f"lb-{probes}", "GET /healthz HTTP/1.1")
    assert answered in access and len(access) == len({request_id for _, request_id, _ in access}), access
