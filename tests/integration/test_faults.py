"""Fault injection on a deployment laid out as docs/deploy.md says (docs/design/worker.md#subprocess;
tests/integration/fault_site.py).

Real PostgreSQL, Redis behind a TCP proxy that is cut, moto's S3, real Celery workers (prefork), a
maintenance worker and beat, all with short intervals (reaper every 2 s). Each test replays a fault and
asserts the end state: every Job ends exactly once (succeeded, or failed with a reason) within 3 reaper
intervals after the fault clears (plus the time the mechanism itself documents: the heartbeat timeout, the
broker's visibility timeout and its 10 s sweep), no checkpoint stays ``pending`` after its Run ended, no
multipart upload stays open. Skips without the services on a developer machine, fails under CI.
"""

import io
import os
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit

import psycopg
import pytest
from django.db import connection

from checkpoints import services as checkpoint_services
from checkpoints.models import Checkpoint, CheckpointState
from jobs.models import FINAL_STATES, Job, JobStatus, Queue
from jobs.services import job_abort, job_launch
from mado.models import Dispatch
from mado.outbox import dispatch_send
from tests.checkpoints.checkpoint_helpers import declaration, make_tar, register
from tests.deployment import ROOT, free_port
from tests.factories import CodeFactory
from tests.integration.conftest import S3_BUCKET, require_service
from tests.integration.fault_site import (
    REAPER_INTERVAL,
    broker_for_this_process,
    code_archive,
    database_url,
    fault_site,
    wait_until,
)
from tests.integration.test_checkpoint_s3 import upload_parts

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

SETTLE = 3 * REAPER_INTERVAL  # "within 3 reaper intervals after the fault clears"
HEARTBEAT_TIMEOUT = 10  # fault_site.FAST
REDELIVERY = 6 + 10 + 5  # visibility timeout + the workers' 10 s unacked sweep + a worker's reconnect


@pytest.fixture
def site(tmp_path, redis_url, moto_endpoint, s3_bucket, tcp_proxy, settings):
    require_service(connection.vendor == "postgresql", "MADO_DATABASE_URL does not point at PostgreSQL")
    redis = urlsplit(redis_url)
    proxy = tcp_proxy(redis.hostname, redis.port or 6379)
    with fault_site(
        tmp_path, redis_proxy=proxy, redis_db=int(redis.path.strip("/") or 0), moto_endpoint=moto_endpoint
    ) as running:
        settings.MADO_CHECKPOINT_VERIFY_QUEUE = running.maintenance_queue
        running.redis, running.s3 = proxy, s3_bucket
        yield running


@pytest.fixture
def launch(site, creator, project):
    """``launch(seconds)``: a new Job whose code sleeps ``seconds``, on the site's queue."""
    queue = Queue.objects.create(name=site.queue)
    versions = {}

    def make(seconds: float = 1, **options) -> Job:
        if seconds not in versions:
            code = CodeFactory(project=project, created_by=creator, name=f"sleep-{seconds}")
            versions[seconds] = checkpoint_services.code_version_create_with_archive(
                actor=creator,
                code=code,
                entrypoint=[sys.executable, "train.py", str(site.markers), str(seconds)],
                archive=io.BytesIO(code_archive()),
                archive_name="code.tar.gz",
            )
        return job_launch(
            actor=creator, code_version=versions[seconds], queue=queue, parameters={}, dataset_version_ids=[], **options
        )

    return make


def final(job: Job) -> bool:
    job.refresh_from_db()
    return job.status in FINAL_STATES


def status(job: Job) -> str:
    job.refresh_from_db()
    return job.status


def open_uploads(site) -> list:
    return site.s3.list_multipart_uploads(Bucket=S3_BUCKET).get("Uploads", [])


def start_upload(creator, run) -> Checkpoint:
    """What the SDK does for a large checkpoint: register it and start a multipart upload to S3 (left unfinished)."""
    checkpoint = checkpoint_services.checkpoint_register(actor=creator, run=run, step=100)[0]
    checkpoint_services.checkpoint_upload_parts(actor=creator, checkpoint=checkpoint, tar_size=20 * 1024 * 1024)
    return checkpoint


class HeldJobsTable:
    """Holds an ACCESS EXCLUSIVE lock on ``jobs_job`` from another session: a worker that received a
    ``run_job`` message blocks on its first read of the Job, i.e. between delivery and claim."""

    def __init__(self):
        self.session = psycopg.connect(database_url())
        self.session.execute("LOCK TABLE jobs_job IN ACCESS EXCLUSIVE MODE")

    def blocked_pids(self) -> list[int]:
        """Process ids of the worker processes waiting for the lock (``mado:<pid>``, mado/apps.py)."""
        with psycopg.connect(database_url(), autocommit=True) as probe:
            rows = probe.execute(
                "SELECT application_name FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() "  # another pytest-xdist worker's processes wait elsewhere
                "AND query ILIKE '%%FROM \"jobs_job\"%%' AND application_name LIKE 'mado:%%'"
            ).fetchall()
        return [int(name.split(":")[1]) for (name,) in rows]

    def release(self):
        self.session.rollback()
        self.session.close()


def held_before_its_claim(site, launch) -> tuple[Job, HeldJobsTable]:
    """A new Job whose message reaches a worker that is then blocked between delivery and claim."""
    # The message waits in the outbox while the lock is taken: this process's sends go to a port where nothing
    # listens (the broker refuses), while the workers stay connected. Cutting the proxy instead would also cut
    # the workers, and what this case is about is the kill, not a reconnect (case 3 and the busy-worker test).
    with broker_for_this_process(f"redis://127.0.0.1:{free_port()}/0"):
        job = launch(1)
        held = HeldJobsTable()
    try:
        row = Dispatch.objects.get(
            task_id=job.celery_task_id
        )  # sent as the flush would (its hook reads the locked table)
        wait_until(lambda: dispatch_send(dispatch_id=row.pk), 60, "the broker takes the message", site)
    except BaseException:
        held.release()  # else the test database's teardown waits for the lock for good
        raise
    return job, held


def test_case_1_a_worker_killed_between_delivery_and_claim_does_not_lose_the_job(site, launch):
    site.start_worker("w1")
    site.wait_ready("w1")
    for victim in ("pool process", "whole worker"):
        job, held = held_before_its_claim(site, launch)
        try:
            pids = []
            wait_until(
                lambda pids=pids, held=held: pids.extend(held.blocked_pids()) or pids,
                120,
                "a worker blocks before its claim",
                site,
            )
            if victim == "pool process":
                assert pids[0] in site.pool_children("w1")
                os.kill(pids[0], signal.SIGKILL)
            else:
                site.kill("w1")
        finally:
            held.release()
        if victim == "whole worker":
            site.start_worker("w1")  # the unacknowledged message comes back after the visibility timeout
        wait_until(lambda job=job: final(job), REDELIVERY + SETTLE + 30, f"the Job ends ({victim})", site)
        assert (job.status, site.starts(job.run)) == (JobStatus.SUCCEEDED, 1), (victim, job.error, site.logs())


def test_case_2_killed_and_aborted_jobs_leave_no_pending_checkpoint_upload_or_work_directory(site, launch, creator):
    for name in ("w1", "w2", "maint"):
        site.start_worker(name, queues=[site.maintenance_queue] if name == "maint" else None)
    site.start_beat()
    killed, aborted = launch(120), launch(120)
    wait_until(
        lambda: (
            status(killed) == status(aborted) == JobStatus.RUNNING
            and site.starts(killed.run)
            and site.starts(aborted.run)
        ),
        90,
        "both Jobs run their code",
        site,
    )
    uploads = {job.pk: start_upload(creator, job.run) for job in (killed, aborted)}
    assert len(open_uploads(site)) == 2
    workdir = site.directory / "work" / f"job-{killed.pk}"
    assert workdir.is_dir()

    site.kill(killed.worker_host.split("@")[0])
    job_abort(actor=creator, job=aborted)
    wait_until(lambda: final(killed) and final(aborted), HEARTBEAT_TIMEOUT + SETTLE + 20, "both Jobs end", site)
    assert killed.status == JobStatus.FAILED and killed.error.startswith("Worker lost")
    assert aborted.status == JobStatus.ABORTED
    wait_until(
        lambda: not Checkpoint.objects.filter(state=CheckpointState.PENDING).exists() and not open_uploads(site),
        SETTLE + 10,
        "the janitor ends both checkpoints and aborts their uploads",
        site,
    )
    for checkpoint in uploads.values():
        checkpoint.refresh_from_db()
        assert checkpoint.state == CheckpointState.ERROR
        assert checkpoint.error == "The Run ended before the upload was finished; save the checkpoint again."

    restarted = killed.worker_host.split("@")[0]
    site.start_worker(restarted)
    wait_until(lambda: not workdir.exists(), 60, "the restarted worker removes the killed Job's work directory", site)


def test_case_3_a_broker_outage_leaves_jobs_queued_and_loses_nothing(
    site, launch, api, creator, run, django_capture_on_commit_callbacks
):
    for name in ("w1", "w2", "maint"):
        site.start_worker(name, queues=[site.maintenance_queue] if name == "maint" else None)
    site.start_beat()
    # 25 s: long enough to outlast the upload and the outage, short enough that the queued Jobs behind them are
    # claimed before MADO_DISPATCH_TIMEOUT (20 s here) sends them again and then fails them (with 40 s, one failed)
    running = [launch(25), launch(25)]
    queued = [launch(1), launch(1)]
    wait_until(lambda: all(status(job) == JobStatus.RUNNING for job in running), 90, "two Jobs run", site)
    client = api(creator)
    checkpoint_id = register(client, run, 10, key="k10").json()["id"]
    files = {"model.pt": os.urandom(9 * 1024 * 1024)}
    tar = make_tar(files)
    upload_id, parts = upload_parts(client, checkpoint_id, tar)

    site.redis.cut()
    outage_started = time.monotonic()
    assert all(status(job) == JobStatus.RUNNING for job in running), "premise: both Jobs run as the outage begins"
    answer = client.post(
        "/api/v1/jobs/", {"code_version_id": queued[0].code_version_id, "queue": site.queue}, format="json"
    )  # (a) a launch during the outage
    assert answer.status_code == 201, answer.content
    assert (answer.json()["status"], answer.json()["waiting_for_queue"]) == ("queued", True)
    during = Job.objects.get(pk=answer.json()["id"])
    done = client.post(
        f"/api/v1/checkpoints/{checkpoint_id}/complete/",
        {**declaration(tar, files), "upload_id": upload_id, "parts": parts},
        format="json",
    )
    assert done.status_code == 202, done.content  # (b) the verification's message cannot be sent now
    time.sleep(max(0.0, 10 - (time.monotonic() - outage_started)))
    assert all(status(job) == JobStatus.RUNNING for job in running), "(c) running Jobs ride out the outage"
    site.redis.restore()

    jobs = [*running, *queued, during]
    wait_until(lambda: all(final(job) for job in jobs), 25 + REDELIVERY + SETTLE + 30, "every Job ends", site)
    assert [(job.status, site.starts(job.run)) for job in jobs] == [(JobStatus.SUCCEEDED, 1)] * 5, site.logs()
    wait_until(
        lambda: Checkpoint.objects.get(pk=checkpoint_id).state != CheckpointState.PENDING,
        SETTLE + 30,
        "the verification runs once the broker is back",
        site,
    )
    assert Checkpoint.objects.get(pk=checkpoint_id).state == CheckpointState.COMPLETE
    assert not open_uploads(site)


def test_after_a_broker_reconnect_a_busy_worker_leaves_the_next_job_to_an_idle_one(site, launch):
    """docs/deploy.md, "Messages and outages": a long Job never holds another hostage, also after the broker
    came back (a busy worker reserves no message beyond the Jobs it runs)."""
    for name in ("w1", "w2"):
        site.start_worker(name)
        site.wait_ready(name)
    busy = launch(120)  # long enough to still run after the outage on a loaded machine (a 40 s one had ended)
    wait_until(lambda: status(busy) == JobStatus.RUNNING, 60, "the long Job runs", site)
    site.redis.cut()
    time.sleep(3)
    site.redis.restore()
    wait_until(
        lambda: all(site.log(name).count("Connected to redis") >= 2 for name in ("w1", "w2")),
        60,
        "both workers reconnect",
        site,
    )
    assert status(busy) == JobStatus.RUNNING, "the long Job ended before the outage was over"
    quick = launch(1)
    wait_until(
        lambda: final(quick), 90, f"the quick Job ends; {list(Dispatch.objects.values('sent_at', 'sends'))}", site
    )
    assert quick.status == JobStatus.SUCCEEDED and quick.worker_host != busy.worker_host, site.logs()
    # The event itself rather than a deadline a loaded machine misses: the busy worker never received the quick
    # Job's message (a reserved one would be logged "received", then wait there or come back after a redelivery).
    busy_worker = busy.worker_host.split("@")[0]
    assert quick.celery_task_id not in site.log(busy_worker), f"the busy worker reserved the quick Job\n{site.logs()}"


def test_case_6_without_a_secret_key_the_server_refuses_to_start(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MADO_", "DJANGO_"))}
    env.update(MADO_DEBUG="0", MADO_DATA_DIR=str(tmp_path))
    started = subprocess.run(
        [sys.executable, "-c", "import config.wsgi"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert started.returncode != 0
    assert "MADO_SECRET_KEY is not set: set MADO_SECRET_KEY (or MADO_SECRET_KEY_FILE" in started.stderr
    check = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode != 0 and "mado.E001" in check.stderr
    env["MADO_SECRET_KEY"] = "a-production-key-" + "x9" * 30
    assert (
        subprocess.run(
            [sys.executable, "-c", "import config.wsgi"], cwd=ROOT, env=env, capture_output=True, timeout=120
        ).returncode
        == 0
    )
