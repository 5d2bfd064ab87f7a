"""The lost-work ledger and what it says about checkpointing (docs/design/alerts.md#reliability).

For every Run of a Project that ended ``crashed``, ``preempted`` or
``failed`` with a complete checkpoint before its end:

- lost work = end − the last complete checkpoint's creation before the end
  (the state it saved), or the Run's start when it has none;
- restart = its resumed child's first point − its end (0 when not resumed);
- GPU-hours lost = GPUs × (lost work + restart) / 3600 s, GPUs = the Job's
  ``nproc_per_node × nnodes`` (1 for a Run without a Job).

Then: failures per ISO week; MTBF per queue = hours run (start to end of
every ended Run on it) / its failures; per Code the median checkpoint stall
C (a checkpoint's completion − its creation) and median interval between a
Run's checkpoints; the Young/Daly interval √(2 · MTBF · C) with the
Project's MTBF; and what checkpointing every Young/Daly interval X would
have saved: Σ GPUs × max(0, lost work − X/2) over the Code's failures (a
failure loses half an interval on average), beside the extra stalls it
costs: Σ GPUs × hours run × C × max(0, 1/X − 1/current interval).
"""

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from statistics import median

from django.db.models import Min

from checkpoints.models import Checkpoint, CheckpointState
from runs.models import MetricSummary, Run, RunStatus

LOST_STATES = (RunStatus.CRASHED, RunStatus.PREEMPTED, RunStatus.FAILED)
NO_QUEUE = "(no queue)"
NO_CODE = "(no code)"


@dataclass
class LostRun:
    """One failure of the ledger; times in seconds."""

    run_id: int
    name: str
    status: str
    queue: str
    code: str
    gpus: int
    ended_at: datetime
    checkpoint_at: datetime | None
    lost_work_s: float
    restart_s: float
    resumed_by: int | None

    @property
    def gpu_hours(self) -> float:
        return self.gpus * (self.lost_work_s + self.restart_s) / 3600


@dataclass
class CodeAdvice:
    code: str
    stall_s: float | None
    interval_s: float | None
    young_daly_s: float | None
    failures: int
    saved_gpu_hours: float | None
    extra_stall_gpu_hours: float | None


@dataclass
class Reliability:
    ledger: list[LostRun]
    weeks: list[dict]
    queues: list[dict]
    codes: list[CodeAdvice]
    mtbf_h: float | None
    gpu_hours_lost: float
    hours_run: float
    recommendation: CodeAdvice | None = field(default=None)


def _gpus(run: Run) -> int:
    job = getattr(run, "job", None) if run.ran_as_job else None
    return job.nproc_per_node * job.nnodes if job is not None else 1


def _queue(run: Run) -> str:
    job = getattr(run, "job", None) if run.ran_as_job else None
    return job.queue.name if job is not None else NO_QUEUE


def _code(run: Run) -> str:
    return run.code_version.code.name if run.code_version_id else NO_CODE


def _checkpoints(run_ids: list[int]) -> dict[int, list[tuple[datetime, datetime | None]]]:
    rows = Checkpoint.objects.filter(run_id__in=run_ids, state=CheckpointState.COMPLETE).order_by("created_at")
    found = defaultdict(list)
    for run_id, created, completed in rows.values_list("run_id", "created_at", "completed_at"):
        found[run_id].append((created, completed))
    return found


def _first_points(run_ids: list[int]) -> dict[int, datetime]:
    rows = MetricSummary.objects.filter(run_id__in=run_ids).values("run_id").annotate(first=Min("first_timestamp"))
    return {row["run_id"]: datetime.fromtimestamp(row["first"] / 1000, tz=UTC) for row in rows}


def _ledger(runs: list[Run], checkpoints: dict, children: dict[int, Run], first_points: dict) -> list[LostRun]:
    ledger = []
    for run in runs:
        if run.status not in LOST_STATES or run.ended_at is None:
            continue
        saved = [created for created, _ in checkpoints.get(run.pk, []) if created <= run.ended_at]
        if run.status == RunStatus.FAILED and not saved:
            continue  # a failure before any checkpoint is the code's bug, not lost progress
        since = saved[-1] if saved else (run.started_at or run.created_at)
        child = children.get(run.pk)
        restart = 0.0
        if child is not None:
            first = first_points.get(child.pk) or child.started_at
            restart = max(0.0, (first - run.ended_at).total_seconds()) if first else 0.0
        ledger.append(
            LostRun(
                run_id=run.pk,
                name=run.name or run.external_id,
                status=run.status,
                queue=_queue(run),
                code=_code(run),
                gpus=_gpus(run),
                ended_at=run.ended_at,
                checkpoint_at=saved[-1] if saved else None,
                lost_work_s=max(0.0, (run.ended_at - since).total_seconds()),
                restart_s=restart,
                resumed_by=child.pk if child is not None else None,
            )
        )
    return ledger


def _weeks(ledger: list[LostRun]) -> list[dict]:
    weeks = defaultdict(lambda: {"failures": 0, "gpu_hours": 0.0})
    for lost in ledger:
        monday = (lost.ended_at - timedelta(days=lost.ended_at.weekday())).date()
        weeks[monday]["failures"] += 1
        weeks[monday]["gpu_hours"] += lost.gpu_hours
    return [{"week": week, **values} for week, values in sorted(weeks.items())]


def _hours(run: Run) -> float:
    start = run.started_at or run.created_at
    return max(0.0, (run.ended_at - start).total_seconds() / 3600) if run.ended_at else 0.0


def _queues(runs: list[Run], ledger: list[LostRun]) -> list[dict]:
    hours, failures = defaultdict(float), defaultdict(int)
    for run in runs:
        hours[_queue(run)] += _hours(run)
    for lost in ledger:
        failures[lost.queue] += 1
    return [
        {
            "queue": q,
            "hours_run": hours[q],
            "failures": failures[q],
            "mtbf_h": hours[q] / failures[q] if failures[q] else None,
        }
        for q in sorted(hours)
    ]


def young_daly_s(mtbf_s: float, stall_s: float) -> float:
    """The checkpoint interval that minimises expected lost work, √(2 · MTBF · C), in seconds."""
    return math.sqrt(2 * mtbf_s * stall_s)


def _code_advice(
    code: str, runs: list[Run], ledger: list[LostRun], checkpoints: dict, mtbf_h: float | None
) -> CodeAdvice:
    stalls, intervals = [], []
    for run in runs:
        saved = checkpoints.get(run.pk, [])
        stalls += [(done - created).total_seconds() for created, done in saved if done is not None]
        intervals += [(b[0] - a[0]).total_seconds() for a, b in zip(saved, saved[1:])]
    stall = median(stalls) if stalls else None
    interval = median(intervals) if intervals else None
    failures = [lost for lost in ledger if lost.code == code]
    if stall is None or not mtbf_h:
        return CodeAdvice(code, stall, interval, None, len(failures), None, None)
    best = young_daly_s(mtbf_h * 3600, stall)
    saved_h = sum(lost.gpus * max(0.0, lost.lost_work_s - best / 2) for lost in failures) / 3600
    more = max(0.0, 1 / best - (1 / interval if interval else 0.0))
    extra_h = sum(_gpus(run) * _hours(run) * stall * more for run in runs)
    return CodeAdvice(code, stall, interval, best, len(failures), saved_h, extra_h)


def project_reliability(*, project) -> Reliability:
    """The lost-work ledger of ``project`` and the figures above (module docstring); reads only."""
    runs = list(
        Run.objects.filter(project=project, deleted_at__isnull=True)
        .select_related("job__queue", "code_version__code")
        .order_by("ended_at", "pk")
    )
    ended = [run for run in runs if run.ended_at is not None]
    ids = [run.pk for run in runs]
    checkpoints = _checkpoints(ids)
    children = {run.parent_id: run for run in runs if run.parent_id}
    ledger = _ledger(ended, checkpoints, children, _first_points([run.pk for run in children.values()]))
    hours_run = sum(_hours(run) for run in ended)
    mtbf_h = hours_run / len(ledger) if ledger else None
    by_code = defaultdict(list)
    for run in runs:
        by_code[_code(run)].append(run)
    codes = [_code_advice(code, members, ledger, checkpoints, mtbf_h) for code, members in sorted(by_code.items())]
    ranked = [c for c in codes if c.saved_gpu_hours is not None]
    return Reliability(
        ledger=ledger,
        weeks=_weeks(ledger),
        queues=_queues(ended, ledger),
        codes=codes,
        mtbf_h=mtbf_h,
        gpu_hours_lost=sum(lost.gpu_hours for lost in ledger),
        hours_run=hours_run,
        recommendation=max(ranked, key=lambda c: c.saved_gpu_hours) if ranked else None,
    )


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def reliability_json(rel: Reliability) -> dict:
    """``rel`` as the API answers it (hours, seconds, ISO dates; docs/api.md "Reliability")."""
    return {
        "gpu_hours_lost": _round(rel.gpu_hours_lost),
        "hours_run": _round(rel.hours_run),
        "failures": len(rel.ledger),
        "mtbf_hours": _round(rel.mtbf_h),
        "weeks": [
            {"week": w["week"].isoformat(), "failures": w["failures"], "gpu_hours_lost": _round(w["gpu_hours"])}
            for w in rel.weeks
        ],
        "queues": [{**q, "hours_run": _round(q["hours_run"]), "mtbf_h": _round(q["mtbf_h"])} for q in rel.queues],
        "codes": [
            {
                "code": c.code,
                "checkpoint_stall_s": _round(c.stall_s),
                "checkpoint_interval_s": _round(c.interval_s),
                "young_daly_interval_s": _round(c.young_daly_s),
                "failures": c.failures,
                "saved_gpu_hours": _round(c.saved_gpu_hours),
                "extra_stall_gpu_hours": _round(c.extra_stall_gpu_hours),
            }
            for c in rel.codes
        ],
        "ledger": [
            {
                "run_id": lost.run_id,
                "name": lost.name,
                "status": lost.status,
                "queue": lost.queue,
                "code": lost.code,
                "gpus": lost.gpus,
                "ended_at": lost.ended_at.isoformat(),
                "last_checkpoint_at": lost.checkpoint_at.isoformat() if lost.checkpoint_at else None,
                "lost_work_s": _round(lost.lost_work_s),
                "restart_s": _round(lost.restart_s),
                "gpu_hours_lost": _round(lost.gpu_hours),
                "resumed_by": lost.resumed_by,
            }
            for lost in rel.ledger
        ],
    }
