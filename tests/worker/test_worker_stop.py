"""Every stop of the worker reaches the Job's code (docs/design/worker.md#stop): the code gets the stop signal once,
has its grace period to save, and the Job ends ``preempted`` with the reason, its Run ``preempted``; a stopping
worker claims nothing.

In process: ``run_job`` with the worker's stop recorded (``worker.shutdown.request_stop``) before the claim, before
the code starts and while it runs. Through real processes, once per pool: a Celery worker (prefork, solo) started
by the test on a fresh ``MADO_DATA_DIR`` (file SQLite, filesystem broker) whose whole process group a process
manager stops (``kill -TERM -- -PGID``, ``kill -INT -- -PGID``) while the code runs.
"""

import json
import mmap
import os
import signal
import subprocess
import sys
import uuid

import pytest
from celery.exceptions import Reject

from jobs import services as jobs_services
from jobs.models import JobStatus
from mado.env import env_signal
from runs.models import RunStatus
from tests.deployment import ROOT, deployment_env, migrate
from tests.worker.helpers import tar_gz
from tests.worker.test_real_worker import process_alive, rows, wait_until
from tests.worker.test_tasks import log_of
from worker import shutdown
from worker import tasks as worker_tasks
from worker.runner import RunOutcome
from worker.tasks import run_job

WORKER_STOPPED = "The worker was stopped (SIGTERM to the worker)"


@pytest.fixture
def stop_page(monkeypatch):
    """A page of its own for the worker's stop, so a stop recorded by one test is not seen by the next."""
    monkeypatch.setattr(shutdown, "_SHARED", mmap.mmap(-1, 4))


def stop_when_logged(monkeypatch, text="ready"):
    """The worker is stopped (SIGTERM) as soon as ``text`` shows in the Job's log: the code is running by then."""
    real = jobs_services.job_append_log

    def append(*, job_id, **kwargs):
        chunk = real(job_id=job_id, **kwargs)
        if text in kwargs["text"]:
            shutdown.request_stop(signal.SIGTERM)
        return chunk

    monkeypatch.setattr(jobs_services, "job_append_log", append)


@pytest.mark.django_db
def test_a_stopping_worker_leaves_the_message_for_another_worker(stop_page, launch, control, monkeypatch):
    monkeypatch.setattr("worker.tasks.REJECT_PAUSE_S", 0)
    marker = control(wait=True)
    job = launch()
    shutdown.request_stop(signal.SIGINT)
    with pytest.raises(Reject) as refused:
        run_job(job.pk)
    assert refused.value.requeue
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED and not job.worker_host and not marker.exists()


@pytest.mark.django_db
def test_a_stop_while_the_code_runs_sends_it_sigterm_and_preempts_the_job(stop_page, launch, control, monkeypatch):
    control(wait=True)
    job = launch()
    stop_when_logged(monkeypatch)
    assert run_job(job.pk) == JobStatus.PREEMPTED
    job.refresh_from_db()
    assert job.exit_code == 143 and job.run.status == RunStatus.PREEMPTED
    assert job.error.startswith(f"{WORKER_STOPPED}: the code was sent SIGTERM and exited with code 143 after ")
    log = log_of(job)
    assert log.count("SIGTERM received, saving and exiting") == 1 and job.error in log


@pytest.mark.django_db
def test_code_that_ignores_the_stop_is_killed_after_the_grace_period(stop_page, launch, control, monkeypatch, settings):
    settings.MADO_JOB_KILL_GRACE = 1
    control(wait=True, ignore_term=True)
    job = launch()
    stop_when_logged(monkeypatch)
    assert run_job(job.pk) == JobStatus.PREEMPTED
    job.refresh_from_db()
    assert job.exit_code == -signal.SIGKILL and job.run.status == RunStatus.PREEMPTED
    assert (
        job.error
        == f"{WORKER_STOPPED}: the code was sent SIGTERM, was still running 1 s later and was killed (SIGKILL)."
    )


@pytest.mark.django_db
def test_a_stop_before_the_code_starts_preempts_the_job_and_runs_nothing(stop_page, launch, control, monkeypatch):
    marker = control(wait=True)
    job = launch()
    real = jobs_services.job_claim

    def claim_then_stop(**kwargs):
        claimed = real(**kwargs)
        shutdown.request_stop(signal.SIGTERM)
        return claimed

    monkeypatch.setattr(jobs_services, "job_claim", claim_then_stop)
    assert run_job(job.pk) == JobStatus.PREEMPTED
    job.refresh_from_db()
    assert (job.exit_code, job.error) == (None, f"{WORKER_STOPPED} before the code started.")
    assert job.run.status == RunStatus.PREEMPTED and not marker.exists()


@pytest.mark.django_db
def test_a_worker_process_runs_one_job_at_a_time(stop_page, launch, control, monkeypatch):
    """The solo pool runs a message whose countdown ran out on Celery's timer thread, beside the running Job."""
    monkeypatch.setattr("worker.tasks.REJECT_PAUSE_S", 0)
    marker = control(wait=True)
    job = launch()
    with worker_tasks._ONE_JOB:  # a Job runs in this process
        with pytest.raises(Reject) as refused:
            run_job(job.pk)
    assert refused.value.requeue and "runs another Job" in str(refused.value.reason)
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED and not marker.exists()


@pytest.mark.django_db
def test_a_cold_shutdown_breaking_into_the_job_preempts_it_with_a_clear_reason(stop_page, launch, control, monkeypatch):
    control(wait=True)
    job = launch()

    def cold_shutdown(job):
        shutdown.request_stop(signal.SIGINT)
        raise NotImplementedError("<class 'celery.concurrency.solo.TaskPool'> does not implement kill_job")

    monkeypatch.setattr("worker.execute.execute", cold_shutdown)
    assert run_job(job.pk) == JobStatus.PREEMPTED
    job.refresh_from_db()
    assert job.error == shutdown.cold_stop_reason(signal.SIGINT) and "kill_job" not in job.error
    assert job.run.status == RunStatus.PREEMPTED


def test_the_reason_says_how_the_code_ended():
    ended = RunOutcome(exit_code=-signal.SIGTERM, stopped=True, stop_to_exit_s=0.04)
    assert shutdown.stopped_reason(signal.SIGINT, ended, stop_signal=signal.SIGUSR1, grace_s=30) == (
        "The worker was stopped (SIGINT to the worker): the code was sent SIGUSR1 and was ended by SIGTERM after 0.0 s."
    )


@pytest.mark.parametrize(
    ("value", "expected"), [("SIGTERM", signal.SIGTERM), ("usr1", signal.SIGUSR1), (" SIGINT ", signal.SIGINT)]
)
def test_the_stop_signal_setting_takes_a_signal_name(monkeypatch, value, expected):
    monkeypatch.setenv("MADO_JOB_STOP_SIGNAL", value)
    assert env_signal("MADO_JOB_STOP_SIGNAL", signal.SIGTERM) is expected


@pytest.mark.parametrize("value", ["SIGKILL", "stop", "15", "SIGNOPE", "SIG_IGN", ""])
def test_the_stop_signal_setting_refuses_what_no_code_could_catch_or_is_no_signal(monkeypatch, value):
    from django.core.exceptions import ImproperlyConfigured

    monkeypatch.setenv("MADO_JOB_STOP_SIGNAL", value)
    with pytest.raises(ImproperlyConfigured, match="MADO_JOB_STOP_SIGNAL"):
        env_signal("MADO_JOB_STOP_SIGNAL", signal.SIGTERM)


# The Job's code: saves a "checkpoint" (a file naming the signal) when told to stop, then exits 143.
TRAIN_PY = b"""import os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1]) / os.environ["MMT_RUN_ID"]
out.mkdir()
def save_and_exit(signum, frame):
    (out / "checkpoint").write_text(signal.Signals(signum).name)
    print("saved a checkpoint on", signal.Signals(signum).name, flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, save_and_exit)
signal.signal(signal.SIGUSR1, save_and_exit)
(out / "pid").write_text(str(os.getpid()))
print("ready", flush=True)
time.sleep(120)
"""

# Two Jobs on the test's own queue: the worker runs one; the other must still be queued after the worker stopped.
SEED = """
import io, json, sys
from checkpoints.services import code_version_create_with_archive
from jobs.models import Queue
from jobs.services import job_launch
from runs.models import Code, Membership, Project, Role
from tests.factories import UserFactory
user = UserFactory(username="carol")
project = Project.objects.create(name="Vision", slug="vision")
Membership.objects.create(user=user, project=project, role=Role.MEMBER)
code = Code.objects.create(project=project, name="trainer", created_by=user)
queue = Queue.objects.create(name={queue!r}, runner="subprocess")
version = code_version_create_with_archive(
    actor=user, code=code, entrypoint=[sys.executable, "train.py", {out!r}],
    archive=io.BytesIO(bytes.fromhex({archive!r})), archive_name="code.tar.gz",
)
jobs = [
    job_launch(actor=user, code_version=version, queue=queue, parameters={{}}, dataset_version_ids=[], name=name)
    for name in ("first", "second")
]
print(json.dumps({{job.run.external_id: job.pk for job in jobs}}))
"""


def seed(tmp_path, **variables: str) -> tuple[dict, str, dict]:
    """A migrated ``MADO_DATA_DIR`` with the two Jobs of ``SEED`` on a queue of the test's own; ``(env, queue,
    {run external id: job id})``. The code writes into ``tmp_path / "out"``."""
    queue, out = f"stop-{uuid.uuid4().hex[:8]}", tmp_path / "out"
    out.mkdir()
    env = deployment_env(tmp_path / "data", MADO_PUBLIC_URL="http://mado.test:8000", **variables)
    migrate(env)
    archive = tar_gz([("./", None), ("./train.py", TRAIN_PY)]).hex()
    seeded = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", SEED.format(queue=queue, out=str(out), archive=archive)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return env, queue, json.loads(seeded.stdout.strip().splitlines()[-1])


def start_worker(env: dict, queue: str, pool: str, log) -> subprocess.Popen:
    """One Celery worker on ``queue`` in its own process group and session, as under a process manager."""
    argv = [sys.executable, "-m", "celery", "-A", "config", "worker", "--queues", queue, "--pool", pool]
    argv += ["--concurrency", "1", "--hostname", f"{queue}@%h", "--without-gossip", "--without-mingle"]
    with open(log, "wb") as output:
        return subprocess.Popen(
            [*argv, "--loglevel", "INFO"],
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def jobs_and_runs(database) -> dict[int, tuple]:
    """``{job id: (status, exit code, error, its Run's status)}`` read from the worker's database file."""
    found = rows(
        database,
        "SELECT j.id, j.status, j.exit_code, j.error, r.status FROM jobs_job j JOIN runs_run r ON r.id = j.run_id",
    )
    return {job_id: rest for job_id, *rest in found}


@pytest.mark.parametrize(
    ("pool", "group_signal", "stop_signal"),
    [
        ("prefork", signal.SIGTERM, "SIGTERM"),  # the pool child gets SIGTERM too
        ("solo", signal.SIGTERM, "SIGTERM"),
        ("prefork", signal.SIGINT, "SIGUSR1"),  # the pool child ignores SIGINT: the main process tells it
    ],
)
def test_a_process_manager_stopping_the_worker_preempts_the_job_after_its_code_saved(
    tmp_path, pool, group_signal, stop_signal
):
    env, queue, jobs = seed(tmp_path, MADO_JOB_KILL_GRACE="20", MADO_JOB_STOP_SIGNAL=stop_signal)
    out, database, log = tmp_path / "out", tmp_path / "data" / "mado.sqlite3", tmp_path / "worker.log"
    worker = start_worker(env, queue, pool, log)
    try:
        wait_until(lambda: any((out / run / "pid").exists() for run in jobs), "the code to start", worker, log)
        (running,) = [run for run in jobs if (out / run / "pid").exists()]
        (waiting,) = [run for run in jobs if run != running]
        code_pid = int((out / running / "pid").read_text())
        before = jobs_and_runs(database)
        assert (before[jobs[running]][0], before[jobs[waiting]][0]) == ("running", "queued")  # the premise

        os.killpg(worker.pid, group_signal)
        # Celery's warm shutdown: 0 after SIGTERM, 1 after SIGINT (Ctrl-C)
        assert worker.wait(timeout=60) == (0 if group_signal == signal.SIGTERM else 1), log.read_text()[-4000:]

        assert (out / running / "checkpoint").read_text() == stop_signal  # the code's handler ran and saved
        assert not process_alive(code_pid)
        found = jobs_and_runs(database)
        status, exit_code, error, run_status = found[jobs[running]]
        assert (status, exit_code, run_status) == ("preempted", 143, "preempted"), error
        assert error.startswith(
            f"The worker was stopped ({group_signal.name} to the worker): the code was sent {stop_signal} and exited "
            "with code 143 after "
        ), error
        assert found[jobs[waiting]][0] == "queued" and not (out / waiting).exists()  # no new Job once stopping
        assert not [job for job in found.values() if "failed" in (job[0], job[3])], found
        assert "WorkerLostError" not in log.read_text()
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
