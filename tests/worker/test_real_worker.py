"""A real Celery worker process (``celery -A config worker -Q cpu --pool solo``, embedded filesystem broker,
file SQLite) runs resumed Jobs end to end, refuses a tampered checkpoint before the code starts, skips
messages of Jobs that are no longer queued, and, when SIGKILLed mid-Job, takes the code down with it and
leaves the Job to the reaper (docs/design/worker.md).

Everything runs out of this process: ``manage.py migrate`` and ``tests.worker.real_worker_setup`` seed
the database of a fresh ``MADO_DATA_DIR``; the test reads the Job rows straight from that SQLite file.
"""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from tests.deployment import migrate
from tests.worker.helpers import FILES

ROOT = Path(__file__).resolve().parents[2]
FINAL = {"succeeded", "failed", "aborted"}


def rows(database: Path, sql: str, *params) -> list[tuple]:
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=30)) as connection:
        return connection.execute(sql, params).fetchall()


def job(database: Path, job_id: int) -> dict:
    columns = ("status", "exit_code", "error", "worker_host")
    found = rows(database, f"SELECT {', '.join(columns)} FROM jobs_job WHERE id = ?", job_id)
    return dict(zip(columns, found[0]))


def wait_until(predicate, what: str, worker, log: Path, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        assert worker.poll() is None, f"the worker exited:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}; worker log:\n{log.read_text()[-4000:]}")


def process_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.fixture
def deployment(tmp_path):
    """A migrated, seeded ``MADO_DATA_DIR`` and the environment of processes that use it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MADO_", "CELERY_", "DJANGO_", "MMT_"))}
    env.update(
        {
            "MADO_DATA_DIR": str(tmp_path / "data"),
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "MADO_WORKER_GPUS": "none",
            "MADO_JOB_KILL_GRACE": "2",
            "MADO_PUBLIC_URL": "http://mado.test:8000",
            "MADO_SECRET_KEY": "worker-only-secret-value",
            "MADO_LOG_LEVEL": "INFO",
        }
    )
    python = [sys.executable]
    migrate(env)
    seeded = subprocess.run(
        [*python, "-m", "tests.worker.real_worker_setup", str(tmp_path)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    ids = json.loads(seeded.stdout.strip().splitlines()[-1])
    return env, ids, tmp_path / "data" / "mado.sqlite3", tmp_path / "markers"


def test_a_real_worker_runs_resumes_refuses_tampering_and_dies_cleanly(deployment, tmp_path):
    env, ids, database, markers = deployment
    sources_before = rows(
        database,
        "SELECT * FROM runs_run WHERE id IN (?, ?) ORDER BY id",
        ids["good"]["source_run"],
        ids["tampered"]["source_run"],
    )
    others = "SELECT * FROM checkpoints_checkpoint WHERE id != ? ORDER BY id"
    checkpoints_before = rows(database, others, ids["tampered"]["checkpoint"])
    log = tmp_path / "worker.log"
    with open(log, "wb") as output:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "-Q",
                "cpu",
                "--pool",
                "solo",
                "--concurrency",
                "1",
                "--hostname",
                "wtest@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel",
                "INFO",
            ],
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        good, tampered, waiting = ids["good"], ids["tampered"], ids["waiting"]
        wait_until(
            lambda: job(database, good["job"])["status"] in FINAL and job(database, tampered["job"])["status"] in FINAL,
            "the two resumed Jobs",
            worker,
            log,
        )

        done = job(database, good["job"])
        assert (done["status"], done["exit_code"], done["error"]) == ("succeeded", 0, "")
        assert done["worker_host"].startswith("wtest@")
        seen = json.loads((markers / f"{good['run_external_id']}.json").read_text())
        assert seen["env"]["MMT_RESUME_STEP"] == "20" and seen["env"]["MMT_RUN_ID"] == good["run_external_id"]
        assert {path: data.encode("latin-1") for path, data in seen["files"].items()} == FILES
        assert seen["resume_file"]["checkpointId"] == good["checkpoint"]
        assert "worker-only-secret-value" not in json.dumps(seen["env"])
        logged = "".join(
            text
            for (text,) in rows(
                database,
                "SELECT text FROM jobs_runlogchunk c JOIN jobs_job j ON j.run_id = c.run_id "
                "WHERE j.id = ? ORDER BY seq",
                good["job"],
            )
        )
        assert "training code started" in logged

        refused = job(database, tampered["job"])
        assert refused["status"] == "failed" and refused["exit_code"] is None
        assert refused["error"].startswith(f"Checkpoint {tampered['checkpoint']} sha256 mismatch: 'model.pt'")
        assert not (markers / f"{tampered['run_external_id']}.json").exists(), "the code ran on a bad checkpoint"

        # The source Jobs' own messages reached the worker after they had ended: never run.
        for label in ("good", "tampered"):
            assert job(database, ids[label]["source_job"])["worker_host"] == "an-earlier-worker"
        assert (
            rows(
                database,
                "SELECT * FROM runs_run WHERE id IN (?, ?) ORDER BY id",
                good["source_run"],
                tampered["source_run"],
            )
            == sources_before
        )
        assert rows(database, others, tampered["checkpoint"]) == checkpoints_before
        # the tampered one's stored tar differs from its record: named corrupt (docs/design/checkpoints.md#damage)
        ((state, error),) = rows(
            database, "SELECT state, error FROM checkpoints_checkpoint WHERE id = ?", tampered["checkpoint"]
        )
        assert state == "corrupt" and error.startswith("the tar: the stored object's SHA-256 is"), error

        # SIGKILL the worker while the code runs: the code dies with it, the Job is not started again.
        marker = markers / f"{waiting['run_external_id']}.json"
        wait_until(marker.exists, "the waiting Job's code to start", worker, log)
        code_pid = json.loads(marker.read_text())["pid"]
        assert process_alive(code_pid) and job(database, waiting["job"])["status"] == "running"
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        deadline = time.monotonic() + 10
        while process_alive(code_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not process_alive(code_pid), "the code outlived its SIGKILLed worker"
        assert job(database, waiting["job"])["status"] == "running"  # until the reaper sees no heartbeat
        reaper = (
            "from datetime import timedelta; from django.utils import timezone; "
            "from jobs.services import job_reap_stale; print(job_reap_stale(now=timezone.now() + timedelta(hours=1)))"
        )
        subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", reaper], cwd=ROOT, env=env, check=True, capture_output=True
        )
        lost = job(database, waiting["job"])
        assert lost["status"] == "failed" and lost["error"].startswith("Worker lost: no heartbeat from wtest@")
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
