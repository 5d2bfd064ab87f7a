"""Shared by the metric summary tests (SQLite here, PostgreSQL in tests/integration): a recomputation of every
summary and rollup from the stored points, and a random program of writes, retries, resumes and deletions
(hypothesis)."""

import math

from hypothesis import strategies as st

from runs.metric_rollup import ROLLUP_STEPS
from runs.metrics import metrics_ingest
from runs.models import MetricChunk, MetricPoint, MetricRollup, MetricSummary, Run, RunStatus
from runs.resume import run_start
from runs.services import run_set_status

KEYS = ["loss", "acc", "lr"]
VALUES = st.one_of(
    st.floats(allow_nan=False, width=64), st.sampled_from(["NaN", "Infinity", "-Infinity"]), st.integers(-10, 10)
)
POINT = st.fixed_dictionaries(
    {
        "key": st.sampled_from(KEYS),
        "step": st.integers(0, 3 * ROLLUP_STEPS),
        "value": VALUES,
        "timestamp": st.integers(1_700_000_000, 1_700_000_100),
    }
)
OPERATION = st.one_of(
    st.tuples(st.just("write"), st.lists(POINT, min_size=1, max_size=12), st.booleans(), st.booleans()),
    st.tuples(st.just("retry")),
    st.tuples(st.just("resume")),
    st.tuples(st.just("delete")),
)
PROGRAM = st.lists(OPERATION, min_size=1, max_size=14)


def store_points_directly(points: list[tuple]) -> None:
    """Store ``(run, key, step, value, timestamp)`` points one chunk each, in this order, bypassing ``metrics_ingest``
    (no summary or rollup): points stored before an upgrade that fills those in."""
    MetricChunk.objects.bulk_create(
        [
            MetricChunk(
                run=run,
                key=key,
                first_step=step,
                last_step=step,
                count=1,
                steps=[step],
                values=[math.nan if value is None else value],
                timestamps=[ts],
            )
            for run, key, step, value, ts in points
        ]
    )


def recomputed(run_id: int) -> dict[str, tuple]:
    """Every key's summary figures computed from scratch over the stored points (NaN as None)."""
    out = {}
    rows = MetricPoint.objects.filter(run_id=run_id).order_by("key", "step", "id")
    for key, step, value, ts in rows.values_list("key", "step", "value", "timestamp"):
        count, first, _, _, low, high, first_ts, last_ts = out.get(key, (0, step, 0, 0, None, None, ts, ts))
        if value is not None:
            low = value if low is None else min(low, value)
            high = value if high is None else max(high, value)
        out[key] = (count + 1, first, step, value, low, high, min(first_ts, ts), max(last_ts, ts))
    return out


def stored(run_id: int) -> dict[str, tuple]:
    """The summaries the write path kept, in the shape of ``recomputed``."""
    fields = (
        "key",
        "count",
        "first_step",
        "last_step",
        "last_value",
        "min_value",
        "max_value",
        "first_timestamp",
        "last_timestamp",
    )
    return {row[0]: row[1:] for row in MetricSummary.objects.filter(run_id=run_id).values_list(*fields)}


def recomputed_rollups(run_id: int) -> dict[tuple, tuple]:
    """Every (key, bucket)'s rollup computed from scratch: count, non-finite count, and the (step, value,
    timestamp) of the smallest and the largest finite value (lowest step, then first stored, on a tie)."""
    groups: dict[tuple, list] = {}
    rows = MetricPoint.objects.filter(run_id=run_id).order_by("id").values_list("key", "step", "value", "timestamp")
    for key, step, value, ts in rows:
        groups.setdefault((key, step // ROLLUP_STEPS), []).append((step, value, ts))
    out = {}
    for group, points in groups.items():
        finite = [p for p in points if p[1] is not None and math.isfinite(p[1])]
        low = min(finite, key=lambda p: (p[1], p[0]), default=(None, None, None))
        high = min(finite, key=lambda p: (-p[1], p[0]), default=(None, None, None))
        out[group] = (len(points), len(points) - len(finite), *low, *high)
    return out


def stored_rollups(run_id: int) -> dict[tuple, tuple]:
    """The rollups the write path kept, in the shape of ``recomputed_rollups``."""
    fields = (
        "key",
        "bucket",
        "count",
        "non_finite",
        "min_step",
        "min_value",
        "min_timestamp",
        "max_step",
        "max_value",
        "max_timestamp",
    )
    return {row[:2]: row[2:] for row in MetricRollup.objects.filter(run_id=run_id).values_list(*fields)}


def _columnar(points: list[dict]) -> dict:
    return {
        "keys": [p["key"] for p in points],
        "steps": [p["step"] for p in points],
        "values": [p["value"] for p in points],
        "timestamps": [p["timestamp"] for p in points],
    }


def play(program, *, actor, project, name: str) -> None:
    """Run ``program`` against a fresh Run ``name``, asserting after each operation that its summaries and rollups
    equal a recomputation (and that a deleted Run leaves none behind)."""
    run = run_start(actor=actor, project=project, external_id=name, resume="allow", host="h", pid=1).run
    last, batches = None, 0
    for operation in program:
        kind = operation[0]
        if kind == "write":
            _, points, columnar, with_key = operation
            batches += 1
            batch = {"columns": _columnar(points)} if columnar else {"points": points}
            last = dict(batch, idempotency_key=f"{name}-{batches}" if with_key else None)
            metrics_ingest(actor=actor, run=run, **last)
        elif kind == "retry" and last is not None:  # the same batch again: a no-op with a key, else stored twice
            metrics_ingest(actor=actor, run=run, **last)
        elif kind == "resume":
            run_set_status(actor=actor, run=run, status=RunStatus.FAILED)
            run = run_start(actor=actor, project=project, external_id=name, resume="allow", host="h", pid=2).run
        elif kind == "delete":
            run_id = run.pk
            Run.objects.filter(pk=run_id).delete()
            assert stored(run_id) == {} and recomputed(run_id) == {} and stored_rollups(run_id) == {}
            run = run_start(actor=actor, project=project, external_id=name, resume="allow", host="h", pid=3).run
            last = None
        assert _same(stored(run.pk), recomputed(run.pk)), (stored(run.pk), recomputed(run.pk))
        assert stored_rollups(run.pk) == recomputed_rollups(run.pk)


def _same(left: dict, right: dict) -> bool:
    """Equal, with NaN equal to NaN (``min``/``max`` of ±Infinity are plain floats, NaN is stored as None)."""

    def norm(row):
        return tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in row)

    return {k: norm(v) for k, v in left.items()} == {k: norm(v) for k, v in right.items()}
