"""A broker that accepts connections but never answers (docs/deploy.md, "Messages, workers and outages"), on a real
deployment: gunicorn and a Celery worker on Redis behind a ``TcpProxy`` that stalls. A Job launch answers within
``MADO_BROKER_SEND_TIMEOUT_S``, the Job queued and waiting for the queue, its message left in the outbox saying the
send timed out. The hung broker then drops its connections (as a restarted one does, so nothing the web sent before
arrives by itself) and answers again: the outbox's flush sends the messages and the worker runs each Job once.
"""

import socket
import sqlite3
import subprocess
import sys
import time
from urllib.parse import urlsplit

import pytest
import requests

from tests.deployment import ROOT, deployment, deployment_env

pytestmark = pytest.mark.timeout(300)

DEADLINE = 2  # MADO_BROKER_SEND_TIMEOUT_S of the deployment
# What the launch itself may take on a loaded machine. A send without the deadline waits out the broker's socket
# timeout (10 s, config/settings.py) at least once, so a launch under DEADLINE + MARGIN was bounded by the deadline.
MARGIN = 5
TRAIN_PY = "import os\nprint('trained in run', os.environ['MMT_RUN_ID'])\n"


@pytest.fixture
def site(tmp_path, redis_url, tcp_proxy):
    """A deployment whose broker sits behind a proxy: ``(site, proxy, its variables)``."""
    broker = urlsplit(redis_url)
    proxy = tcp_proxy(broker.hostname, broker.port or 6379)
    variables = {
        "CELERY_BROKER_URL": broker._replace(netloc=f"127.0.0.1:{proxy.port}").geturl(),
        "MADO_BROKER_SEND_TIMEOUT_S": str(DEADLINE),
    }
    with deployment(tmp_path, **variables) as running:
        yield running, proxy, variables


def job(site, job_id: int) -> dict:
    answer = requests.get(f"{site.url}/api/v1/jobs/{job_id}/", headers=auth(site), timeout=30)
    assert answer.status_code == 200, answer.text[:300]
    return answer.json()


def auth(site) -> dict[str, str]:
    return {"Authorization": f"Bearer {site.token}"}


def wait_for(condition, what: str, site, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}\n{site.logs()}"
        time.sleep(0.3)


def launch(site, version_id: int) -> tuple[dict, float]:
    """POST a Job of code version ``version_id`` on the site's queue; ``(its JSON, seconds the answer took)``."""
    started = time.monotonic()
    answer = requests.post(
        f"{site.url}/api/v1/jobs/",
        json={"code_version_id": version_id, "queue": site.queue},
        headers=auth(site),
        timeout=60,
    )
    took = time.monotonic() - started
    assert answer.status_code == 201, answer.text[:300]
    return answer.json(), took


def outbox_row(site, job_id: int) -> tuple:
    """``(sent_at, last_error)`` of Job ``job_id``'s message, read from the deployment's database."""
    with sqlite3.connect(f"file:{site.data_dir / 'mado.sqlite3'}?mode=ro", uri=True, timeout=30) as database:
        return database.execute(
            "SELECT d.sent_at, d.last_error FROM mado_dispatch d JOIN jobs_job j ON j.celery_task_id = d.task_id "
            "WHERE j.id = ?",
            (job_id,),
        ).fetchone()


def assert_silent(proxy) -> None:
    """The premise: the broker's port accepts a connection and never answers it."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as probe:
        probe.sendall(b"PING\r\n")
        probe.settimeout(1)
        with pytest.raises(TimeoutError):
            probe.recv(64)


def log_text(site, job_id: int) -> str:
    answer = requests.get(f"{site.url}/api/v1/jobs/{job_id}/logs/", headers=auth(site), timeout=30)
    assert answer.status_code == 200, answer.text[:300]
    return "".join(chunk["text"] for chunk in answer.json()["results"])


def test_a_launch_during_a_silent_broker_answers_within_the_deadline_and_the_flush_starts_the_job(site, tmp_path):
    site, proxy, variables = site
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN_PY)
    pushed = site.mado(
        "code", "push", code, "--project", "flow", "--name", "tiny", "--entrypoint", "python train.py", "-q"
    )
    assert pushed.exit_code == 0, pushed.output
    version_id = int(pushed.output)
    before, _ = launch(site, version_id)  # the web has an open connection to the broker, used once
    wait_for(lambda: job(site, before["id"])["status"] == "succeeded", "the Job before the outage runs", site)

    proxy.stall()
    assert_silent(proxy)
    during = []
    for _ in range(2):  # on an open pooled connection or a new one, whichever gunicorn process answers
        answered, took = launch(site, version_id)
        assert (answered["status"], answered["waiting_for_queue"]) == ("queued", True), answered
        assert took < DEADLINE + MARGIN, f"the launch took {took:.1f} s with a silent broker"
        sent_at, last_error = outbox_row(site, answered["id"])
        assert sent_at is None and last_error.startswith("BrokerTimeout: timed out:"), last_error
        during.append(answered["id"])

    proxy.cut()  # the hung broker restarts: its connections die, with what the web's abandoned sends wrote
    abandoned = f"past its {DEADLINE} s deadline: it failed"
    wait_for(
        lambda: site.web_log.read_text(errors="replace").count(abandoned) == len(during),
        "the web's abandoned sends end on the dropped connections",
        site,
    )
    proxy.restore()
    flush = subprocess.run(  # beat's flush-dispatches, run once now
        [sys.executable, "manage.py", "shell", "-c", "from mado.outbox import dispatch_flush; print(dispatch_flush())"],
        cwd=ROOT,
        env=deployment_env(site.data_dir, **variables),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (flush.returncode, flush.stdout.split()[-1:]) == (0, [str(len(during))]), flush.stderr[-3000:]
    for job_id in during:
        wait_for(lambda job_id=job_id: job(site, job_id)["status"] == "succeeded", f"Job {job_id} runs", site)
        assert not job(site, job_id)["waiting_for_queue"]
        assert log_text(site, job_id).count("trained in run") == 1, log_text(site, job_id)
