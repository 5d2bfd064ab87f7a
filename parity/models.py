"""What a resumed Run restored from its checkpoint and how its points compare with its parent's
(docs/design/resume.md#restore-report, #parity).

``RestoreReport``: the one report a resumed Run's SDK sends after loading its checkpoint (which parts of the
training state came back). ``Parity``: the verdict of a Run started from a checkpoint (resumed or continued) over the
steps it and its parent both logged from the checkpoint's step on, kept current from ``ParityBlock`` rows (one per
metric key and block of ``BLOCK_STEPS`` steps). ``ParitySettings``: a Project's relative tolerance.
"""

from django.db import models
from django.db.models import Q

from runs.models import Project, ResumeSegment, Run, VisibleQuerySet

BLOCK_STEPS = 64  # steps per ParityBlock: a block's compared steps fit one 64-bit mask
DEFAULT_TOLERANCE = 1e-6


class ParitySettings(models.Model):
    """A Project's parity settings (docs/design/resume.md#parity); a Project without a row uses the defaults."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, primary_key=True, related_name="parity_settings")
    tolerance = models.FloatField(
        default=DEFAULT_TOLERANCE,
        help_text="relative difference (0 to 1) under which a resumed run's value still counts as the same as its "
        "parent's: |child - parent| <= tolerance * max(|child|, |parent|)",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "parity settings"
        constraints = [
            models.CheckConstraint(condition=Q(tolerance__gte=0, tolerance__lte=1), name="paritysettings_tolerance")
        ]

    def __str__(self):
        return f"{self.project}: {self.tolerance:g}"


class ParityVerdict(models.TextChoices):
    IDENTICAL = "identical", "identical"
    WITHIN_TOLERANCE = "within_tolerance", "within tolerance"
    DIVERGED = "diverged", "diverged"
    UNKNOWN = "unknown", "unknown"


class ParityQuerySet(VisibleQuerySet):
    project_path = "run__project"


class Parity(models.Model):
    """The parity verdict of ``run`` (started from a checkpoint at ``checkpoint_step``) with its ``parent``
    (docs/design/resume.md#parity).

    Written only by ``parity.services``; it always equals the aggregate of its
    ``ParityBlock`` rows: ``verdict`` ``unknown`` while no (key, step) was
    logged by both at a step >= ``checkpoint_step``; ``diverged`` at ``step``
    (the lowest step where a key differs by more than ``tolerance``, ``key``
    the first such key by name, ``parent_value`` / ``child_value`` its values,
    NULL for NaN); else ``identical`` when every compared value is the same
    float, else ``within_tolerance``. ``child_first_step`` is the lowest step
    the Run logged at (the "resume ignored?" signal when below the
    checkpoint's step). ``expects_restore_report``: the source checkpoint
    held a training state when the Run's first metrics came, so an SDK that
    loaded it sent a restore report before them
    (docs/design/resume.md#checkpoint-not-loaded).
    """

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="parity")
    parent = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="child_parities")
    checkpoint_step = models.BigIntegerField(help_text="the source checkpoint's step: points from this step on count")
    tolerance = models.FloatField(help_text="the Project's tolerance the verdict was computed with")
    verdict = models.CharField(max_length=20, choices=ParityVerdict.choices, default=ParityVerdict.UNKNOWN)
    step = models.BigIntegerField(null=True, blank=True, help_text="diverged: the first step where the runs part")
    key = models.CharField(max_length=250, blank=True, help_text="diverged: the key that parts first")
    parent_value = models.FloatField(null=True, blank=True, help_text="diverged: the parent's value (NULL: NaN)")
    child_value = models.FloatField(null=True, blank=True, help_text="diverged: this run's value (NULL: NaN)")
    compared_points = models.BigIntegerField(default=0, help_text="(key, step) pairs both runs logged")
    compared_steps = models.BigIntegerField(default=0, help_text="steps where at least one key was compared")
    compared_keys = models.JSONField(default=list, blank=True, help_text="keys compared at one step or more, sorted")
    first_step = models.BigIntegerField(null=True, blank=True, help_text="lowest compared step")
    last_step = models.BigIntegerField(null=True, blank=True, help_text="highest compared step")
    max_difference = models.FloatField(
        null=True, blank=True, help_text="largest relative difference among the compared values (NULL: none yet)"
    )
    child_first_step = models.BigIntegerField(null=True, blank=True, help_text="lowest step this run logged at")
    expects_restore_report = models.BooleanField(
        default=False,
        help_text="the source checkpoint holds a training state (metadata.training_state): an SDK that loads it "
        "reports what it restored before the run's first metrics",
    )
    updated_at = models.DateTimeField(auto_now=True)

    objects = ParityQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "parities"
        constraints = [
            models.CheckConstraint(condition=Q(verdict__in=ParityVerdict.values), name="parity_verdict_valid"),
        ]

    def __str__(self):
        return f"{self.run_id} vs {self.parent_id}: {self.verdict}"

    @property
    def first_step_below_checkpoint(self) -> int | None:
        """The Run's first logged step when it lies below the checkpoint's: the code may have ignored it."""
        first = self.child_first_step
        return first if first is not None and first < self.checkpoint_step else None

    def checkpoint_not_loaded(self, *, reported: bool) -> bool:
        """True when the Run logged metrics without loading a checkpoint that holds a training state: no restore
        report (``reported`` False) though one was expected (docs/design/resume.md#checkpoint-not-loaded)."""
        return self.expects_restore_report and self.child_first_step is not None and not reported


class ParityBlock(models.Model):
    """The comparison of one ``key`` at steps ``block * BLOCK_STEPS`` to ``(block + 1) * BLOCK_STEPS - 1`` of a
    ``Parity`` (from the checkpoint's step on; recomputed whole whenever a batch of either Run reaches into it) or
    of a resume segment (``segment``: its points against the Run's series, docs/design/resume.md#same-run-parity;
    recomputed whole whenever a batch brings the segment points in it). Exactly one of ``parity`` and ``segment``
    is set.

    ``mask`` bit ``i`` (two's complement in a signed 64-bit column): step
    ``block * BLOCK_STEPS + i`` was compared; ``compared`` how many steps;
    ``identical`` every compared value the same float (NaN = NaN);
    ``diverged_step`` the first step beyond the tolerance (NULL: none) with
    both values (NULL: NaN); ``max_difference`` the largest relative difference.
    Only blocks with at least one compared step have a row.
    """

    parity = models.ForeignKey(
        Parity, null=True, blank=True, on_delete=models.CASCADE, related_name="blocks", db_index=False
    )
    segment = models.ForeignKey(
        ResumeSegment, null=True, blank=True, on_delete=models.CASCADE, related_name="blocks", db_index=False
    )
    key = models.CharField(max_length=250)
    block = models.BigIntegerField()
    mask = models.BigIntegerField()
    compared = models.IntegerField()
    identical = models.BooleanField()
    first_step = models.BigIntegerField()
    last_step = models.BigIntegerField()
    diverged_step = models.BigIntegerField(null=True, blank=True)
    parent_value = models.FloatField(null=True, blank=True)
    child_value = models.FloatField(null=True, blank=True)
    max_difference = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["parity", "key", "block"], name="parityblock_unique_parity_key_block"),
            models.UniqueConstraint(fields=["segment", "key", "block"], name="parityblock_unique_segment_key_block"),
            models.CheckConstraint(
                condition=Q(parity__isnull=False, segment__isnull=True) | Q(parity__isnull=True, segment__isnull=False),
                name="parityblock_one_owner",
            ),
        ]

    def __str__(self):
        owner = f"segment {self.segment_id}" if self.parity_id is None else self.parity_id
        return f"{owner}:{self.key}:{self.block}"


class RestorePart(models.TextChoices):
    RESTORED = "restored", "restored"
    NOT_RESTORED = "not_restored", "not restored"
    UNKNOWN = "unknown", "unknown"
    NOT_DECLARED = "not_declared", "not declared"  # the checkpoint cannot describe it (e.g. no data position)


class RestoreReportQuerySet(VisibleQuerySet):
    project_path = "run__project"


class RestoreReport(models.Model):
    """What ``run``'s code restored from ``checkpoint`` (docs/design/resume.md#restore-report): ``parts`` maps each
    part of the training state the SDK checked to ``restored`` / ``not_restored`` / ``unknown`` / ``not_declared``,
    ``details`` one line per part. One per Run; a later report of the same Run replaces it (``reported_at`` is its
    time)."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="restore_report")
    checkpoint = models.ForeignKey(
        "checkpoints.Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    parts = models.JSONField(default=dict)
    details = models.JSONField(default=dict, blank=True)
    reported_at = models.DateTimeField()
    reports = models.PositiveIntegerField(default=1, help_text="how many reports the Run sent (the last one is kept)")

    objects = RestoreReportQuerySet.as_manager()

    def __str__(self):
        return f"{self.run_id}: {', '.join(self.not_restored) or 'all restored'}"

    @property
    def not_restored(self) -> list[str]:
        return sorted(part for part, state in self.parts.items() if state == RestorePart.NOT_RESTORED)

    @property
    def unknown(self) -> list[str]:
        return sorted(part for part, state in self.parts.items() if state == RestorePart.UNKNOWN)

    @property
    def not_declared(self) -> list[str]:
        return sorted(part for part, state in self.parts.items() if state == RestorePart.NOT_DECLARED)
