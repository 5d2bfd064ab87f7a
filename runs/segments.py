"""The segments of a Run resumed under its id: opened by each resume, fed the points replayed below the floor
(docs/design/resume.md#same-run-parity).

``segment_open`` runs in the resume's transaction (``runs.resume``), ``segment_points_add`` in a metrics batch's
(``runs.metrics``): both are atomic with what they belong to, and a batch replayed under its ``Idempotency-Key``
rolls back with the rest of it. The verdicts are the parity app's (``parity.services.segments``), told by
``runs.hooks.segment_points_stored`` once the batch commits.
"""

from typing import NamedTuple

import numpy as np
from django.db import connection

from runs.metric_batch import MetricColumns
from runs.models import ResumeSegment, Run, SegmentPoint


def segment_open(*, run: Run) -> ResumeSegment:
    """Open segment ``run.resume_count`` of ``run`` (just resumed, row locked by the caller, fields current): its
    floor is ``run.step_floor`` and its writer's token ``run.lease_token``
    (docs/design/resume.md#same-run-parity). Raises ``IntegrityError`` if that number exists (two resumes cannot
    both hold the lock)."""
    return ResumeSegment.objects.create(
        run=run, number=run.resume_count, lease_token=run.lease_token, floor=run.step_floor
    )


_TABLE = SegmentPoint._meta.db_table
_ON_CONFLICT = "ON CONFLICT (segment_id, key, step) DO UPDATE SET value_bits = excluded.value_bits"
_UPSERT = f"INSERT INTO {_TABLE} (segment_id, key, step, value_bits) VALUES (%s, %s, %s, %s) {_ON_CONFLICT}"
_UPSERT_ARRAYS = (  # PostgreSQL: one statement for the whole batch
    f"INSERT INTO {_TABLE} (segment_id, key, step, value_bits) "
    f"SELECT %s, * FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) {_ON_CONFLICT}"
)


class SegmentPointsAdded(NamedTuple):
    """What ``segment_points_add`` kept: the segment's id, and each key's first and last step in the batch."""

    segment_id: int
    steps: dict[str, tuple[int, int]]


def segment_points_add(*, run_id: int, below: MetricColumns) -> SegmentPointsAdded | None:
    """Keep ``below`` (a batch's points under the Run's floor) as the points of Run ``run_id``'s latest segment;
    that segment's id and the batch's step span per key, or None when the Run has none (it was resumed before
    segments existed: the caller drops the points as before). Call inside the batch's transaction, after its
    checks passed.

    At one (key, step) sent twice, here or in an earlier batch, the value sent last is kept
    (docs/design/resume.md#same-run-parity); every value is kept bit for bit (-0.0, NaN, ±inf). Cost: one query
    for the segment, one upsert of the batch's distinct (key, step) pairs.
    """
    segment_id = ResumeSegment.objects.filter(run_id=run_id).order_by("-number").values_list("pk", flat=True).first()
    if segment_id is None:
        return None
    latest: dict[tuple[str, int], int] = {}
    steps: dict[str, tuple[int, int]] = {}
    for key, step, bits in zip(below.keys, below.steps.tolist(), values_to_bits(below.values)):
        latest[(key, step)] = bits
        first, last = steps.get(key, (step, step))
        steps[key] = (min(first, step), max(last, step))
    # Not the ORM's bulk_create: a model instance a point cost most of a batch.
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql" and latest:
            keys, at, bits = zip(*((key, step, value) for (key, step), value in latest.items()))
            cursor.execute(_UPSERT_ARRAYS, [segment_id, list(keys), list(at), list(bits)])
        else:
            cursor.executemany(_UPSERT, [(segment_id, key, step, value) for (key, step), value in latest.items()])
    return SegmentPointsAdded(segment_id, steps)


def values_to_bits(values: np.ndarray) -> list[int]:
    """Float64 ``values`` as the signed 64-bit integers ``SegmentPoint.value_bits`` holds (their IEEE-754 bits)."""
    return np.ascontiguousarray(values, dtype=np.float64).view(np.int64).tolist()


def bits_to_values(bits: list[int]) -> np.ndarray:
    """``SegmentPoint.value_bits`` read back as float64, bit for bit."""
    return np.array(bits, dtype=np.int64).view(np.float64)
