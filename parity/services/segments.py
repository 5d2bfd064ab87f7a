"""The parity verdict of each segment of a Run resumed under its id, and the restore report it sent
(docs/design/resume.md#same-run-parity).

A segment's points (``runs.models.SegmentPoint``: what the resumed writer logged below the Run's floor) are compared
with the Run's series at the same (key, step) — the values the earlier segments logged, the series keeping the
first — by the same rule as a resumed Run with its parent (``parity.compare``), block by block as a ``Parity`` is
(``parity.services.blocks``): after a batch, only the blocks of its keys holding its steps are compared again, and
the verdict is folded from the segment's blocks. The series below the floor never changes once the segment is
open, so a block changes only when the segment gets points in it.
"""

import numpy as np
from django.db import transaction

from checkpoints.models import Checkpoint
from parity.compare import Series, compare_cells
from parity.points import latest_values
from parity.selectors import project_tolerance
from parity.services.blocks import block_span, blocks_fold, blocks_store
from runs.models import ResumeSegment, Run, SegmentPoint
from runs.segments import bits_to_values


def _segment_series(segment_id: int, keys: list[str] | None, low: int | None, high: int | None) -> dict[str, Series]:
    """``{key: (steps, values)}`` of segment ``segment_id``'s points of ``keys`` (None: all) at steps ``low`` to
    ``high`` (None: all), steps increasing, values bit for bit."""
    rows = SegmentPoint.objects.filter(segment_id=segment_id)
    if keys is not None:
        rows = rows.filter(key__in=keys, step__gte=low, step__lte=high)
    found: dict[str, tuple[list[int], list[int]]] = {}
    for key, step, bits in rows.order_by("key", "step").values_list("key", "step", "value_bits").iterator(10_000):
        steps, values = found.setdefault(key, ([], []))
        steps.append(step)
        values.append(bits)
    return {key: (np.array(steps, dtype=np.int64), bits_to_values(bits)) for key, (steps, bits) in found.items()}


@transaction.atomic
def segment_verdict_refresh(*, segment_id: int, steps: dict[str, tuple[int, int]] | None = None) -> None:
    """Compare segment ``segment_id``'s points with its Run's series and store the verdict on the segment
    (docs/design/resume.md#same-run-parity), under the segment's row lock, with the Project's current tolerance:
    ``unknown`` while no (key, step) of the segment is in the series, ``diverged`` at the lowest step beyond the
    tolerance (its key and both values, NULL for NaN), else ``identical`` or ``within_tolerance``.

    ``steps`` (each key a batch brought to ``(first, last)`` step; None: every key and step) names what changed:
    only the blocks of those keys holding steps from the lowest first to the highest last are compared again, the
    whole segment when the Project's tolerance is no longer the one the verdict used. Then the verdict is folded
    from all the segment's blocks (one row per key and 64 steps). Two batches that commit at once each refresh
    after their own commit, and the one that locks last has seen both. A segment that is gone is ignored. Safe to
    call twice.
    """
    segment = ResumeSegment.objects.select_for_update(of=("self",)).filter(pk=segment_id).select_related("run").first()
    if segment is None:
        return
    tolerance = project_tolerance(project_id=segment.run.project_id)
    if tolerance != segment.tolerance:  # every block depends on it
        segment.tolerance, steps = tolerance, None
    keys = low = high = None
    if steps is not None:
        keys = sorted(steps)
        low, high = block_span(min(first for first, _ in steps.values()), max(last for _, last in steps.values()))
    child = _segment_series(segment_id, keys, low, high)
    if child:
        first = min(int(found[0]) for found, _values in child.values())
        last = max(int(found[-1]) for found, _values in child.values())
        before = latest_values(run_id=segment.run_id, keys=sorted(child), low=first, high=last)
        blocks_store(owner={"segment": segment}, cells=compare_cells(before, child, tolerance=tolerance))
    fields = blocks_fold(owner={"segment": segment})
    for name, value in fields.items():
        setattr(segment, name, value)
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
