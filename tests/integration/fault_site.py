"""A deployment laid out as docs/deploy.md says, for fault tests: Job workers, a maintenance worker and beat as
real Celery processes on the test's PostgreSQL database, Redis behind a TCP proxy that can be cut, moto's S3.

The test process is the web tier: it launches Jobs through the services or the API (``transaction=True``
tests, so the workers see the rows) and sends through the same proxied Redis. Intervals are short
(``FAST``): a reaper interval of 2 s, a heartbeat timeout of 10 s, a visibility timeout of 6 s.
"""

import os
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from celery import current_app
from django.db import connection

from tests.deployment import ROOT, deployment_env
from tests.integration.conftest import S3_BUCKET
from tests.worker.helpers import tar_gz
from worker.runner import _parent_death_signal

REAPER_INTERVAL = 2  # seconds
FAST = {
    "MADO_REAPER_INTERVAL": str(REAPER_INTERVAL),
    "MADO_JOB_HEARTBEAT_TIMEOUT": "10",
    "MADO_BROKER_VISIBILITY_TIMEOUT": "6",
    "MADO_DISPATCH_TIMEOUT": "20",
    "MADO_CHECKPOINT_ENDED_GRACE": "0",
    "MADO_JOB_KILL_GRACE": "2",
}

# The Job's code: records each start (one line per process) in <marker dir>/<run id>.starts, then sleeps.
TRAIN_PY = b"""import os, pathlib, sys, time
marker = pathlib.Path(sys.argv[1]) / (os.environ["MMT_RUN_ID"] + ".starts")
with marker.open("a") as out:
    out.write(f"{os.getpid()}\\n")
time.sleep(float(sys.argv[2]))
"""


def code_archive() -> bytes:
    return tar_gz([("./", None), ("./train.py", TRAIN_PY)])


def database_url() -> str:
    """The URL of the test database this process uses (pytest-django's ``test_…`` database)."""
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgresql://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@contextmanager
def broker_for_this_process(url: str):
    """Point this process's Celery app (the outbox's sends) at ``url`` for the block."""
    conf = current_app.conf
    saved = conf.broker_url, conf.broker_transport_options

    def reset():
        current_app._pool = None
        current_app.amqp._producer_pool = None

    conf.broker_url = url
    conf.broker_transport_options = {"socket_connect_timeout": 2, "socket_timeout": 5, "max_retries": 0}  # as settings
    reset()
    try:
        yield
    finally:
        current_app.pool.force_close_all()
        conf.broker_url, conf.broker_transport_options = saved
        reset()


def children_of(pid: int) -> list[int]:
    """The direct child processes of ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@dataclass
class Site:
    directory: Path
    env: dict
    queue: str
    maintenance_queue: str
    markers: Path
    processes: dict = field(default_factory=dict)

    def start_worker(self, name: str, *, queues: list[str] | None = None, concurrency: int = 1) -> subprocess.Popen:
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--queues",
            ",".join(queues or [self.queue]),
            "--concurrency",
            str(concurrency),
            "--hostname",
            f"{name}@%h",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
        ]
        return self._start(name, argv)

    def start_beat(self) -> subprocess.Popen:
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "beat",
            "--loglevel",
            "INFO",
            "--schedule",
            str(self.directory / "beat-schedule"),
        ]
        return self._start("beat", argv)

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.directory / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        # its own process group (a whole-worker kill), and killed with the test process if that dies first
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_parent_death_signal(),
        )
        process.log = log
        self.processes[name] = process
        return process

    def kill(self, name: str) -> None:
        """SIGKILL the whole worker ``name``: main process and pool (the Job's code runs on, its own group)."""
        process = self.processes.pop(name)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        process.log.close()

    def pool_children(self, name: str) -> list[int]:
        return children_of(self.processes[name].pid)

    def log(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_ready(self, name: str, timeout: float = 90) -> None:
        wait_until(lambda: "ready." in self.log(name), timeout, f"{name} ready", self)

    def stop(self) -> None:
        for name in list(self.processes):
            process = self.processes.pop(name)
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
            process.log.close()

    def starts(self, run) -> int:
        """How many times the code of ``run`` started."""
        path = self.markers / f"{run.external_id}.starts"
        return len(path.read_text().split()) if path.exists() else 0

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name} ---\n{path.read_text(errors='replace')[-4000:]}"
            for path in sorted(self.directory.glob("*.log"))
        )


def wait_until(predicate, timeout: float, what: str, site: Site | None = None, interval: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"not within {timeout} s: {what}\n{site.logs() if site else ''}")


@contextmanager
def fault_site(tmp_path: Path, *, redis_proxy, redis_db: int, moto_endpoint: str):
    """Yield a ``Site`` whose processes use the test database, Redis through ``redis_proxy`` and moto's S3."""
    queue, maintenance = f"faults-{uuid.uuid4().hex[:8]}", f"maint-{uuid.uuid4().hex[:8]}"
    broker = f"redis://127.0.0.1:{redis_proxy.port}/{redis_db}"
    env = deployment_env(
        tmp_path / "data",
        MADO_DATABASE_URL=database_url(),
        CELERY_BROKER_URL=broker,
        MADO_MAINTENANCE_QUEUE=maintenance,
        MADO_CHECKPOINT_VERIFY_QUEUE=maintenance,
        MADO_WORKER_WORKDIR=str(tmp_path / "work"),
        MADO_STORAGE="s3",
        MADO_S3_BUCKET=S3_BUCKET,
        MADO_S3_ENDPOINT_URL=moto_endpoint,
        MADO_S3_REGION="us-east-1",
        MADO_S3_ACCESS_KEY_ID="testing",
        MADO_S3_SECRET_ACCESS_KEY="testing",
        MADO_S3_PREFIX="prefix",
        **FAST,
    )
    site = Site(directory=tmp_path, env=env, queue=queue, maintenance_queue=maintenance, markers=tmp_path / "markers")
    site.markers.mkdir()
    try:
        with broker_for_this_process(broker):
            yield site
    finally:
        site.stop()
