"""The storm (docs/design/worker.md#subprocess; marked ``slow``, run by ``make test-integration``): 20 Jobs, 20 SIGKILLs
of worker main or pool processes at random, some of them in the delivery→claim window, on the fault site of
test_faults.py.

Each Job's Run also starts a multipart checkpoint upload while it runs (what the SDK does when it saves),
so a killed Job leaves a pending checkpoint and an open upload for the janitor. The storm prints its
counts and asserts them: lost 0 (still queued), run twice 0 (code started more than once), stuck 0 (still
running), pending checkpoints 0, open uploads 0; every Job ended once, a failed one with its reason.
"""

import os
import random
import signal
import time

import pytest

from checkpoints.models import Checkpoint, CheckpointState
from jobs.models import FINAL_STATES, Job, JobStatus
from mado.errors import UserError
from tests.integration.fault_site import wait_until
from tests.integration.test_faults import (  # noqa: F401 - fixtures
    HEARTBEAT_TIMEOUT,
    REDELIVERY,
    SETTLE,
    HeldJobsTable,
    launch,
    open_uploads,
    site,
    start_upload,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(420)]

JOBS, KILLS = 20, 20
WORKERS = ("w1", "w2", "w3")


def kill_in_the_window(site, rng) -> str | None:
    """Block deliveries before their claim, SIGKILL one blocked process (or its whole worker); None if none came."""
    held = HeldJobsTable()
    try:
        pids = []
        deadline = time.monotonic() + 4
        while not pids and time.monotonic() < deadline:
            pids = [pid for pid in held.blocked_pids() if any(pid in site.pool_children(w) for w in site_workers(site))]
            time.sleep(0.2)
        if not pids:
            return None
        victim = rng.choice(pids)
        if rng.random() < 0.5:
            os.kill(victim, signal.SIGKILL)
            return "pool (window)"
        owner = next(w for w in site_workers(site) if victim in site.pool_children(w))
        site.kill(owner)
        site.start_worker(owner, concurrency=2)
        return "main (window)"
    finally:
        held.release()


def site_workers(site) -> list[str]:
    return [name for name in WORKERS if name in site.processes]


def kill_at_random(site, rng) -> str:
    name = rng.choice(site_workers(site))
    children = site.pool_children(name)
    if children and rng.random() < 0.6:
        os.kill(rng.choice(children), signal.SIGKILL)
        return "pool"
    site.kill(name)
    site.start_worker(name, concurrency=2)
    return "main"


def test_a_storm_of_worker_kills_loses_nothing_and_runs_nothing_twice(site, launch, creator):
    rng = random.Random(int(os.environ.get("MADO_STORM_SEED", "16")))
    for name in WORKERS:
        site.start_worker(name, concurrency=2)
    site.start_worker("maint", queues=[site.maintenance_queue], concurrency=2)
    site.start_beat()
    jobs = [launch(rng.choice([1, 2, 3])) for _ in range(JOBS)]
    uploads: set[int] = set()
    kinds = []
    while len(kinds) < KILLS:
        for job in Job.objects.filter(pk__in=[j.pk for j in jobs], status=JobStatus.RUNNING).exclude(pk__in=uploads):
            try:
                start_upload(creator, job.run)
            except UserError:  # its Run ended meanwhile
                pass
            uploads.add(job.pk)
        kind = kill_in_the_window(site, rng) if len(kinds) % 3 == 0 else None
        kinds.append(kind or kill_at_random(site, rng))
        time.sleep(rng.uniform(0.5, 1.5))
        if (
            len(kinds) % 5 == 0
        ):  # the Jobs the kills failed are retried by nobody: launch more to keep deliveries coming
            jobs.append(launch(1))

    def settled() -> bool:
        return not Job.objects.filter(pk__in=[j.pk for j in jobs]).exclude(status__in=FINAL_STATES).exists()

    wait_until(settled, HEARTBEAT_TIMEOUT + REDELIVERY + SETTLE + 60, "every Job ends", site)
    wait_until(
        lambda: not Checkpoint.objects.filter(state=CheckpointState.PENDING).exists() and not open_uploads(site),
        SETTLE + 20,
        "the janitor ends every pending checkpoint and aborts its upload",
        site,
    )
    rows = list(Job.objects.filter(pk__in=[j.pk for j in jobs]).select_related("run"))
    counts = {
        "jobs": len(rows),
        "kills": len(kinds),
        "kills in the delivery→claim window": sum("window" in kind for kind in kinds),
        "succeeded": sum(job.status == JobStatus.SUCCEEDED for job in rows),
        "failed": sum(job.status == JobStatus.FAILED for job in rows),
        "lost": sum(job.status == JobStatus.QUEUED for job in rows),
        "run twice": sum(site.starts(job.run) > 1 for job in rows),
        "stuck": sum(job.status == JobStatus.RUNNING for job in rows),
        "pending checkpoints": Checkpoint.objects.filter(state=CheckpointState.PENDING).count(),
        "open uploads": len(open_uploads(site)),
        "failed without a reason": sum(job.status == JobStatus.FAILED and not job.error for job in rows),
    }
    print("storm:", ", ".join(f"{name} {value}" for name, value in counts.items()))
    assert {
        k: counts[k]
        for k in ("lost", "run twice", "stuck", "pending checkpoints", "open uploads", "failed without a reason")
    } == dict.fromkeys(
        ("lost", "run twice", "stuck", "pending checkpoints", "open uploads", "failed without a reason"), 0
    ), site.logs()
    assert counts["kills in the delivery→claim window"] >= 1
    assert all(job.ended_at for job in rows)
