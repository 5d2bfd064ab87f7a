"""A seeded history of failures for the Reliability tests, and its figures computed by hand
(docs/design/alerts.md#reliability)."""

import math
from datetime import UTC, datetime, timedelta

from checkpoints.models import Checkpoint, CheckpointState
from jobs.models import Job, JobStatus, Queue
from runs.models import Run, RunStatus
from tests.factories import CodeVersionFactory

T0 = datetime(2026, 11, 2, tzinfo=UTC)  # a Monday
H = timedelta(hours=1)


def _run(project, creator, name, status, start, hours, *, queue=None, gpus=1, code_version=None, parent=None):
    run = Run.objects.create(
        project=project,
        created_by=creator,
        name=name,
        status=status,
        parent=parent,
        code_version=code_version,
        ran_as_job=queue is not None,
    )
    Run.objects.filter(pk=run.pk).update(created_at=start, started_at=start, ended_at=start + hours * H)
    run.refresh_from_db()
    if queue is not None:
        Job.objects.create(
            run=run,
            code_version=code_version,
            queue=queue,
            created_by=creator,
            nproc_per_node=gpus,
            status=JobStatus.SUCCEEDED if status == RunStatus.FINISHED else JobStatus.FAILED,
            started_at=run.started_at,
            ended_at=run.ended_at,
        )
    run.refresh_from_db()
    return run


def _checkpoints(run, hours_after_start, stall_s):
    for step, hours in enumerate(hours_after_start, start=1):
        created = run.started_at + hours * H
        row = Checkpoint.objects.create(run=run, step=step * 100, state=CheckpointState.COMPLETE)
        Checkpoint.objects.filter(pk=row.pk).update(
            created_at=created, completed_at=created + timedelta(seconds=stall_s)
        )


def seed_history(project, creator) -> dict:
    """Runs on two queues over two weeks; returns the runs by name."""
    a100 = Queue.objects.get_or_create(name="gpu-a100")[0]
    cpu = Queue.objects.get_or_create(name="cpu")[0]
    trainer = CodeVersionFactory(code__project=project, code__created_by=creator, code__name="trainer", version=1)
    runs = {}
    runs["r1"] = _run(
        project, creator, "r1-crashed", RunStatus.CRASHED, T0, 10, queue=a100, gpus=8, code_version=trainer
    )
    _checkpoints(runs["r1"], [2, 4, 6, 8], 60)
    runs["r1c"] = _run(
        project,
        creator,
        "r1-resumed",
        RunStatus.FINISHED,
        T0 + 10.5 * H,
        10,
        queue=a100,
        gpus=8,
        code_version=trainer,
        parent=runs["r1"],
    )
    runs["r2"] = _run(
        project, creator, "r2-preempted", RunStatus.PREEMPTED, T0 + 24 * H, 5, queue=a100, gpus=8, code_version=trainer
    )
    _checkpoints(runs["r2"], [1, 2, 3, 4], 60)
    runs["r3"] = _run(
        project, creator, "r3-failed", RunStatus.FAILED, T0 + 7 * 24 * H, 3, queue=cpu, gpus=2, code_version=trainer
    )
    _checkpoints(runs["r3"], [1], 120)
    runs["r4"] = _run(
        project,
        creator,
        "r4-failed-early",
        RunStatus.FAILED,
        T0 + 8 * 24 * H,
        1,
        queue=cpu,
        gpus=2,
        code_version=trainer,
    )
    runs["r5"] = _run(project, creator, "r5-notebook", RunStatus.FINISHED, T0 + 9 * 24 * H, 4)
    return runs


# --- by hand ------------------------------------------------------------------------------------------------------
# r1: 8 GPUs × (10 h − 8 h since its last checkpoint + 0.5 h until its resumed child started) = 20 GPU-h
# r2: 8 GPUs × (5 h − 4 h) = 8 GPU-h (not resumed); r3: 2 GPUs × (3 h − 1 h) = 4 GPU-h;
# r4 failed before any checkpoint (not lost progress), r1c and r5 finished.
LOST = {"r1": 20.0, "r2": 8.0, "r3": 4.0}
GPU_HOURS_LOST = 32.0
HOURS_RUN = 10 + 10 + 5 + 3 + 1 + 4  # every ended Run, start to end
MTBF_H = HOURS_RUN / 3  # 11 h
MTBF_A100_H = (10 + 10 + 5) / 2  # 12.5 h
MTBF_CPU_H = (3 + 1) / 1
STALL_S = 60.0  # median of eight 60 s stalls and one of 120 s
INTERVAL_S = (7200 + 3600) / 2  # median of r1's three 2 h and r2's three 1 h intervals
YOUNG_DALY_S = math.sqrt(2 * MTBF_H * 3600 * STALL_S)  # about 2180 s
SAVED_GPU_H = (8 * (7200 - YOUNG_DALY_S / 2) + 8 * (3600 - YOUNG_DALY_S / 2) + 2 * (7200 - YOUNG_DALY_S / 2)) / 3600
EXTRA_STALL_GPU_H = (8 * 10 + 8 * 10 + 8 * 5 + 2 * 3 + 2 * 1) * STALL_S * (1 / YOUNG_DALY_S - 1 / INTERVAL_S)
WEEKS = [("2026-11-02", 2, 28.0), ("2026-11-09", 1, 4.0)]
