"""The segments of a Run resumed under its id and the points each replayed below its floor
(docs/design/resume.md#same-run-parity).

A same-run resume (``runs.resume``) opens a ``ResumeSegment``; the points its writer then logs below the Run's
step floor (steps the previous segments logged already) are kept as that segment's ``SegmentPoint`` rows, never
in the Run's series, and the parity app compares them with the series and writes the segment's verdict and the
snapshot of its restore report here (docs/design/house.md#arrows: a higher app writes a fact onto the Run's rows).
They live in runs because the points arrive in the metrics batch's own transaction (``runs.metrics``).
"""

from django.db import models
from django.db.models import Q

from runs.models.core import Run

SEGMENT_VERDICTS = ("identical", "within_tolerance", "diverged", "unknown")


class ResumeSegment(models.Model):
    """What the ``number``-th same-run resume of ``run`` (1, 2, …) continued from and how its replay compares.

    ``floor``: the Run's ``step_floor`` that resume set (its last step + 1);
    ``lease_token``: the resuming writer's fencing token. ``checkpoint_id`` /
    ``checkpoint_step``: the checkpoint its restore report names (NULL until
    one came, or when it names none). ``verdict`` … ``max_difference``:
    ``parity.models.Parity``'s fields of the same names, the new segment's
    points (``child_value``) against the Run's series (``parent_value``,
    what the earlier segments logged), NULL values for NaN. ``restore_parts``
    / ``restore_details``: the restore report the segment's writer sent
    (NULL: none).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="resume_segments")
    number = models.PositiveIntegerField(help_text="1 for the Run's first resume under its id, then 2, …")
    lease_token = models.BigIntegerField(help_text="the resuming writer's fencing token")
    floor = models.BigIntegerField(help_text="the Run's step floor this resume set: points below it are compared")
    checkpoint_id = models.BigIntegerField(null=True, blank=True, help_text="the checkpoint its restore report names")
    checkpoint_step = models.BigIntegerField(null=True, blank=True)
    verdict = models.CharField(max_length=20, default="unknown")
    step = models.BigIntegerField(null=True, blank=True)
    key = models.CharField(max_length=250, blank=True)
    parent_value = models.FloatField(null=True, blank=True, help_text="diverged: the earlier segments' value")
    child_value = models.FloatField(null=True, blank=True, help_text="diverged: this segment's value")
    compared_points = models.BigIntegerField(default=0)
    compared_steps = models.BigIntegerField(default=0)
    compared_keys = models.JSONField(default=list, blank=True)
    first_step = models.BigIntegerField(null=True, blank=True)
    last_step = models.BigIntegerField(null=True, blank=True)
    max_difference = models.FloatField(null=True, blank=True)
    tolerance = models.FloatField(null=True, blank=True, help_text="the Project's tolerance the verdict used")
    restore_parts = models.JSONField(null=True, blank=True)
    restore_details = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["run", "number"]
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="resumesegment_unique_run_number"),
            models.CheckConstraint(condition=Q(verdict__in=SEGMENT_VERDICTS), name="resumesegment_verdict_valid"),
        ]

    def __str__(self):
        return f"{self.run_id}#{self.number}: {self.verdict}"

    @property
    def not_restored(self) -> list[str]:
        return self._parts_in("not_restored")

    @property
    def unknown(self) -> list[str]:
        """Parts whose restoring the report could not tell (e.g. a fetched checkpoint not loaded through the SDK)."""
        return self._parts_in("unknown")

    @property
    def not_declared(self) -> list[str]:
        return self._parts_in("not_declared")

    def _parts_in(self, state: str) -> list[str]:
        return sorted(part for part, found in (self.restore_parts or {}).items() if found == state)


class SegmentPoint(models.Model):
    """One point a resumed segment logged at a step below its floor; at one (key, step) the value stored last
    counts, as in a Run's series. ``value_bits``: the float64's IEEE-754 bits (``runs.segments.values_to_bits`` /
    ``bits_to_values``), since a REAL column of SQLite keeps -0.0 as 0 and the comparison is bit for bit."""

    segment = models.ForeignKey(ResumeSegment, on_delete=models.CASCADE, related_name="points", db_index=False)
    key = models.CharField(max_length=250)
    step = models.BigIntegerField()
    value_bits = models.BigIntegerField(
        help_text="the value's IEEE-754 float64 bits as a signed 64-bit integer: -0.0, NaN and ±inf kept exactly"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["segment", "key", "step"], name="segmentpoint_unique_segment_key_step")
        ]

    def __str__(self):
        return f"{self.segment_id}:{self.key}@{self.step}"
