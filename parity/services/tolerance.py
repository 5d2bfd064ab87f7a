"""A Project's parity tolerance (docs/design/resume.md#parity)."""

import math

from django.db import transaction

from mado import policy
from mado.audit import audit_record
from mado.errors import ValidationFailed
from parity.models import Parity, ParitySettings
from parity.services.segments import segment_verdict_refresh
from parity.services.verdict import parity_recompute
from runs.models import Project, ResumeSegment


def clean_tolerance(value) -> float:
    """``value`` as a tolerance: a number from 0 to 1; else ``ValidationFailed`` naming ``tolerance``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value <= 1:
        raise ValidationFailed(
            f"tolerance must be a number from 0 to 1 (a relative difference, e.g. 1e-6), got {value!r}"[:200],
            field="tolerance",
        )
    return float(value)


def parity_tolerance_set(*, actor, project: Project, tolerance) -> ParitySettings:
    """Set ``project``'s relative tolerance (0 to 1) and compare every verdict of its Runs again with it
    (docs/design/resume.md#parity).

    Raises ``Forbidden`` unless ``actor`` administers the Project (None: an
    operator in the Django admin, whose permission Django checked),
    ``ValidationFailed`` naming ``tolerance``. The setting commits first;
    each verdict is then recomputed in its own transaction (bounded by its
    overlap), and one left behind by a killed process is recomputed by the
    next batch that reaches it, which sees the changed tolerance.
    """
    if actor is not None:
        policy.require_role(actor, project, policy.ADMIN)
    value = clean_tolerance(tolerance)
    with transaction.atomic():
        before = ParitySettings.objects.filter(project=project).values_list("tolerance", flat=True).first()
        settings, _ = ParitySettings.objects.update_or_create(project=project, defaults={"tolerance": value})
        if before != value:
            changes = {"parity_tolerance": [before, value]}
            audit_record(
                actor=actor, action="project.set_parity_tolerance", obj=project, project_id=project.pk, changes=changes
            )
    for parity_id in Parity.objects.filter(run__project=project).exclude(tolerance=value).values_list("pk", flat=True):
        parity_recompute(parity_id=parity_id)
    segments = ResumeSegment.objects.filter(run__project=project).exclude(tolerance=value).values_list("pk", flat=True)
    for segment_id in segments:
        segment_verdict_refresh(segment_id=segment_id)
    return settings
