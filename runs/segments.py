"""The segments of a Run resumed under its id: opened by each resume, fed the points replayed below the floor
(docs/design/resume.md#same-run-parity).

``segment_open`` runs in the resume's transaction (``runs.resume``), ``segment_points_add`` in a metrics batch's
(``runs.metrics``): both are atomic with what they belong to, and a batch replayed under its ``Idempotency-Key``
rolls back with the rest of it. The verdicts are the parity app's (``parity.services.segments``), told by
``runs.hooks.segment_points_stored`` once the batch commits.
"""

import math

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


def segment_points_add(*, run_id: int, below: MetricColumns) -> int | None:
    """Keep ``below`` (a batch's points under the Run's floor) as the points of Run ``run_id``'s latest segment;
    the id of that segment, or None when the Run has none (it was resumed before segments existed: the caller
    drops the points as before). Call inside the batch's transaction, after its checks passed.

    At one (key, step) sent twice, here or in an earlier batch, the value sent last is kept
    (docs/design/resume.md#same-run-parity); NaN is stored as NULL. Cost: one query for the segment, one
    upsert of the batch's distinct (key, step) pairs.
    """
    segment_id = ResumeSegment.objects.filter(run_id=run_id).order_by("-number").values_list("pk", flat=True).first()
    if segment_id is None:
        return None
    latest: dict[tuple[str, int], float | None] = {}
    for key, step, value in zip(below.keys, below.steps.tolist(), below.values.tolist()):
        latest[(key, step)] = None if math.isnan(value) else value
    SegmentPoint.objects.bulk_create(
        [SegmentPoint(segment_id=segment_id, key=key, step=step, value=value) for (key, step), value in latest.items()],
        update_conflicts=True,
        unique_fields=["segment", "key", "step"],
        update_fields=["value"],
    )
    return segment_id
