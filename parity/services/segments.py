"""The parity verdict of each segment of a Run resumed under its id, and the restore report it sent
(docs/design/resume.md#same-run-parity).

A segment's points (``runs.models.SegmentPoint``: what the resumed writer logged below the Run's floor) are compared
with the Run's series at the same (key, step) — the values the earlier segments logged, the series keeping the
first — by the same rule as a resumed Run with its parent (``parity.compare``: ``compare_cells`` then
``summarize``). The whole segment is compared again after each batch that brought it points: its points are
bounded by what the resume replayed (the steps from its checkpoint to the floor, times the keys), never by the
Run's size.
"""

import math

import numpy as np
from django.db import transaction

from checkpoints.models import Checkpoint
from parity.compare import Series, compare_cells, summarize
from parity.points import latest_values
from parity.selectors import project_tolerance
from runs.models import ResumeSegment, Run, SegmentPoint


def _segment_series(segment_id: int) -> dict[str, Series]:
    """``{key: (steps, values)}`` of segment ``segment_id``'s points (NULL read as NaN), steps increasing."""
    rows = (
        SegmentPoint.objects.filter(segment_id=segment_id).order_by("key", "step").values_list("key", "step", "value")
    )
    found: dict[str, tuple[list[int], list[float]]] = {}
    for key, step, value in rows.iterator(chunk_size=10_000):
        steps, values = found.setdefault(key, ([], []))
        steps.append(step)
        values.append(math.nan if value is None else value)
    return {
        key: (np.array(steps, dtype=np.int64), np.array(values, dtype=np.float64))
        for key, (steps, values) in found.items()
    }


def _none_if_nan(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


@transaction.atomic
def segment_verdict_refresh(*, segment_id: int) -> None:
    """Compare segment ``segment_id``'s points with its Run's series and store the verdict on the segment
    (docs/design/resume.md#same-run-parity), under the segment's row lock, with the Project's current tolerance:
    ``unknown`` while no (key, step) of the segment is in the series, ``diverged`` at the lowest step beyond the
    tolerance (its key and both values, NULL for NaN), else ``identical`` or ``within_tolerance``. A segment that is
    gone is ignored. Safe to call twice; reads the segment's points and the series over their step range.
    """
    segment = ResumeSegment.objects.select_for_update().filter(pk=segment_id).select_related("run").first()
    if segment is None:
        return
    tolerance = project_tolerance(project_id=segment.run.project_id)
    child = _segment_series(segment_id)
    cells = []
    if child:
        low = min(int(steps[0]) for steps, _values in child.values())
        high = max(int(steps[-1]) for steps, _values in child.values())
        before = latest_values(run_id=segment.run_id, keys=sorted(child), low=low, high=high)
        cells = compare_cells(before, child, tolerance=tolerance)
    fields = summarize(cells)._asdict()
    fields["parent_value"] = _none_if_nan(fields["parent_value"])
    fields["child_value"] = _none_if_nan(fields["child_value"])
    for name, value in fields.items():
        setattr(segment, name, value)
    segment.tolerance = tolerance
    segment.save(update_fields=[*fields, "tolerance", "updated_at"])


def segment_restore_snapshot(
    *, run: Run, checkpoint_id: int | None, parts: dict, details: dict, fencing_token: int | None
) -> None:
    """Copy the restore report ``run``'s writer just stored onto its latest resume segment
    (docs/design/resume.md#same-run-parity), with the checkpoint it names and that checkpoint's step. Nothing for
    a Run never resumed under its id, or when ``fencing_token`` is not the latest segment's writer's (the report
    belongs to an earlier segment's writer: it cannot be, the lease refused it, unless unfenced). Call inside the
    report's transaction, after its lease check."""
    segment = ResumeSegment.objects.filter(run_id=run.pk).order_by("-number").first()
    if segment is None or (fencing_token is not None and segment.lease_token != fencing_token):
        return
    step = None
    if checkpoint_id is not None:
        step = Checkpoint.objects.filter(pk=checkpoint_id).values_list("step", flat=True).first()
    ResumeSegment.objects.filter(pk=segment.pk).update(
        checkpoint_id=checkpoint_id, checkpoint_step=step, restore_parts=parts, restore_details=details
    )
