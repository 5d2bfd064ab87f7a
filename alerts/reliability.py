"""The lost-work ledger and what it says about checkpointing (docs/design/alerts.md#reliability).

For every segment of a Run of a Project that ended ``crashed``,
``preempted`` or ``failed`` with a complete checkpoint before its end (a
``Failure`` row, kept across a resume by id; a Run ended before such rows
from the Run itself), its end being its last sign of life (``last_alive``:
the later of its last heartbeat and last write, not the reaper's pass):

- lost work = end − the last complete checkpoint's creation before the end
  (the state it saved), or the segment's start when it has none;
- restart = its resume by id, or its resumed child's first point, − its end
  (0 when not resumed);
- GPU-hours lost = GPUs × (lost work + restart) / 3600 s, GPUs = the Job's
  ``nproc_per_node × nnodes`` (1 for a Run without a Job).

Then: failures per ISO week; MTBF per queue = hours run (start to end of
every ended Run on it) / its failures; per Code the median checkpoint stall
C (a checkpoint's completion − its creation) and median interval between a
Run's checkpoints; the Young/Daly interval √(2 · MTBF · C) with the
Project's MTBF; and what checkpointing every Young/Daly interval X would
have saved: Σ GPUs × max(0, lost work − X/2) over the Code's failures (a
failure loses half an interval on average), beside the extra stalls it
costs: Σ GPUs × hours run × C × max(0, 1/X − 1/current interval). With
fewer than ``MIN_FAILURES`` failures, or no known stall, no interval is
advised (``NOT_ENOUGH_FAILURES``, ``STALL_UNKNOWN``).
"""

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from statistics import median

from django.db.models import Min

from alerts.models import Failure
from checkpoints.models import Checkpoint, CheckpointState
from runs.models import MetricSummary, Run, RunStatus

LOST_STATES = (RunStatus.CRASHED, RunStatus.PREEMPTED, RunStatus.FAILED)
MIN_FAILURES = 2  # fewer failures in the Project's ledger: no Young/Daly interval is advised (thin data)
NOT_ENOUGH_FAILURES = "not enough failures yet"
STALL_UNKNOWN = "checkpoint stall unknown"
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
    segment: int = 0
    last_alive_at: datetime | None = None
    resumed_at: datetime | None = None

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
    note: str = ""  # why no interval is advised: NOT_ENOUGH_FAILURES or STALL_UNKNOWN


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
    note: str = ""  # NOT_ENOUGH_FAILURES when the ledger is too thin to advise an interval


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


def last_alive(run: Run) -> datetime | None:
    """``run``'s last sign of life: the later of its last heartbeat and its last write (``heartbeat_at``,
    ``last_write_at``), at most its ``ended_at``; its ``ended_at`` when it has neither (None while it runs
    without either). Lost work and hours run of a lost Run end here, not at the reaper's pass
    (docs/design/alerts.md#reliability)."""
    signs = [at for at in (run.heartbeat_at, run.last_write_at) if at is not None]
    if not signs:
        return run.ended_at
    latest = max(signs)
    return min(latest, run.ended_at) if run.ended_at else latest


@dataclass
class _Ending:
    """One lost segment: a ``Failure`` row, or a Run ended before such rows were kept."""

    run: Run
    segment: int
    status: str
    started_at: datetime
    ended_at: datetime
    last_alive_at: datetime
    resumed_at: datetime | None


def _endings(runs: list[Run], failures: dict[int, list[Failure]]) -> list[_Ending]:
    endings = []
    for run in runs:
        kept = failures.get(run.pk, [])
        endings += [
            _Ending(run, f.segment, f.status, f.started_at or f.ended_at, f.ended_at, f.last_alive_at, f.resumed_at)
            for f in kept
        ]
        current = {f.segment for f in kept}
        if run.status in LOST_STATES and run.ended_at is not None and run.resume_count not in current:
            endings.append(
                _Ending(run, run.resume_count, run.status, _segment_start(run), run.ended_at, last_alive(run), None)
            )
    return sorted(endings, key=lambda e: (e.ended_at, e.run.pk, e.segment))


def _ledger(endings: list[_Ending], checkpoints: dict, children: dict[int, Run], first_points: dict) -> list[LostRun]:
    ledger = []
    for end in endings:
        run, alive = end.run, end.last_alive_at
        saved = [created for created, _ in checkpoints.get(run.pk, []) if created <= alive]
        if end.status == RunStatus.FAILED and not saved:
            continue  # a failure before any checkpoint is the code's bug, not lost progress
        since = saved[-1] if saved else end.started_at
        child = children.get(run.pk) if end.resumed_at is None else None
        restart, resumed_at = 0.0, end.resumed_at
        if child is not None:
            resumed_at = first_points.get(child.pk) or child.started_at
        if resumed_at is not None:
            restart = max(0.0, (resumed_at - alive).total_seconds())
        ledger.append(
            LostRun(
                run_id=run.pk,
                name=run.name or run.external_id,
                status=end.status,
                queue=_queue(run),
                code=_code(run),
                gpus=_gpus(run),
                ended_at=end.ended_at,
                checkpoint_at=saved[-1] if saved else None,
                lost_work_s=max(0.0, (alive - since).total_seconds()),
                restart_s=restart,
                resumed_by=child.pk if child is not None else None,
                segment=end.segment,
                last_alive_at=alive,
                resumed_at=end.resumed_at,
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


def _segment_start(run: Run) -> datetime:
    return (run.writer_since if run.resume_count else None) or run.started_at or run.created_at


def _hours(run: Run, failures: dict[int, list[Failure]] | None = None) -> float:
    """Hours ``run`` ran: its segments closed by a resume by id, then its last one if it ended (to its last sign of
    life when it was lost)."""
    closed = [f for f in (failures or {}).get(run.pk, []) if f.segment < run.resume_count]
    hours = sum(max(0.0, (f.last_alive_at - (f.started_at or f.ended_at)).total_seconds()) for f in closed) / 3600
    if run.ended_at is None:
        return hours
    end = last_alive(run) if run.status in LOST_STATES else run.ended_at
    start = _segment_start(run) if closed else (run.started_at or run.created_at)
    return hours + max(0.0, (end - start).total_seconds() / 3600)


def _queues(runs: list[Run], ledger: list[LostRun], run_hours: dict[int, float]) -> list[dict]:
    hours, failures = defaultdict(float), defaultdict(int)
    for run in runs:
        hours[_queue(run)] += run_hours[run.pk]
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
    code: str, runs: list[Run], ledger: list[LostRun], checkpoints: dict, mtbf_h: float | None, run_hours: dict
) -> CodeAdvice:
    stalls, intervals = [], []
    for run in runs:
        saved = checkpoints.get(run.pk, [])
        stalls += [(done - created).total_seconds() for created, done in saved if done is not None]
        intervals += [(b[0] - a[0]).total_seconds() for a, b in zip(saved, saved[1:])]
    stall = median(stalls) if stalls else None
    interval = median(intervals) if intervals else None
    failures = [lost for lost in ledger if lost.code == code]
    if len(ledger) < MIN_FAILURES or not mtbf_h:
        return CodeAdvice(code, stall, interval, None, len(failures), None, None, NOT_ENOUGH_FAILURES)
    if not stall:  # no complete checkpoint with a completion time, or a stall of 0 s: √(2·MTBF·0) advises nothing
        return CodeAdvice(code, stall, interval, None, len(failures), None, None, STALL_UNKNOWN)
    best = young_daly_s(mtbf_h * 3600, stall)
    saved_h = sum(lost.gpus * max(0.0, lost.lost_work_s - best / 2) for lost in failures) / 3600
    more = max(0.0, 1 / best - (1 / interval if interval else 0.0))
    extra_h = sum(_gpus(run) * run_hours[run.pk] * stall * more for run in runs)
    return CodeAdvice(code, stall, interval, best, len(failures), saved_h, extra_h)


def project_reliability(*, project) -> Reliability:
    """The lost-work ledger of ``project`` (a ``runs.Project``) and the figures above (module docstring): times in
    seconds, hours run and MTBF in hours; reads only, raises nothing of its own (docs/design/alerts.md#reliability)."""
    runs = list(
        Run.objects.filter(project=project, deleted_at__isnull=True)
        .select_related("job__queue", "code_version__code")
        .order_by("ended_at", "pk")
    )
    ids = [run.pk for run in runs]
    failures = defaultdict(list)
    for failure in Failure.objects.filter(run_id__in=ids).order_by("segment"):
        failures[failure.run_id].append(failure)
    run_hours = {run.pk: _hours(run, failures) for run in runs}
    counted = [run for run in runs if run.ended_at is not None or run_hours[run.pk] > 0]
    checkpoints = _checkpoints(ids)
    children = {run.parent_id: run for run in runs if run.parent_id}
    endings = _endings(runs, failures)
    ledger = _ledger(endings, checkpoints, children, _first_points([run.pk for run in children.values()]))
    hours_run = sum(run_hours[run.pk] for run in counted)
    mtbf_h = hours_run / len(ledger) if ledger else None
    by_code = defaultdict(list)
    for run in runs:
        by_code[_code(run)].append(run)
    codes = [
        _code_advice(code, members, ledger, checkpoints, mtbf_h, run_hours) for code, members in sorted(by_code.items())
    ]
    ranked = [c for c in codes if c.saved_gpu_hours is not None]
    return Reliability(
        ledger=ledger,
        weeks=_weeks(ledger),
        queues=_queues(counted, ledger, run_hours),
        codes=codes,
        mtbf_h=mtbf_h,
        gpu_hours_lost=sum(lost.gpu_hours for lost in ledger),
        hours_run=hours_run,
        recommendation=max(ranked, key=lambda c: c.saved_gpu_hours) if ranked else None,
        note=NOT_ENOUGH_FAILURES if len(ledger) < MIN_FAILURES else "",
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
        "advice": rel.note or None,
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
                "advice": c.note or None,
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
                "segment": lost.segment,
                "last_alive_at": lost.last_alive_at.isoformat() if lost.last_alive_at else None,
                "resumed_at": lost.resumed_at.isoformat() if lost.resumed_at else None,
            }
            for lost in rel.ledger
        ],
    }
