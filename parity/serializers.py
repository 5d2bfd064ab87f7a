"""The parity app's fields of the Run and Job resources and its output serializers (docs/api.md "Resume parity").

Names are globally unique for the schema. Non-finite values travel as the strings ``"NaN"``, ``"Infinity"`` and
``"-Infinity"``, as metric values do.
"""

import math

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from parity import selectors
from parity.models import Parity, ParityVerdict
from runs.api.serializers import RunOutputSerializer
from runs.models import Run

_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


@extend_schema_field(
    {"oneOf": [{"type": "number"}, {"type": "string", "enum": ["NaN", "Infinity", "-Infinity"]}], "nullable": True}
)
class ParityValueField(serializers.Field):
    """A float, or ``"NaN"`` / ``"Infinity"`` / ``"-Infinity"``; None stays null."""

    def to_representation(self, value):
        if value is None or math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else _NON_FINITE[value]


class DeclaredChangeOutputSerializer(serializers.Serializer):
    key = serializers.CharField(help_text='the parameter changed on purpose, or "data" for a data stage')
    old_value = serializers.JSONField(help_text="its value in the parent run")
    new_value = serializers.JSONField(help_text="its value in this run")
    took_effect_at_step = serializers.IntegerField(
        allow_null=True, help_text="the first step the change shows; null: not seen"
    )
    overridden = serializers.BooleanField(help_text="the optimizer still ran at old_value: the change did nothing")
    overridden_by = serializers.CharField(
        help_text='overridden: "scheduler" (the restored scheduler) or "optimizer" (the restored optimizer state); '
        '"" when not named'
    )
    evidence = serializers.CharField(
        help_text='the metric key that shows it (e.g. "train.lr"), "restore_report", "data_stage" (key "data": a '
        'data stage), or "" when nothing could tell'
    )


class DeclaredOutputSerializer(serializers.Serializer):
    changes = DeclaredChangeOutputSerializer(many=True)
    divergence_declared = serializers.BooleanField(
        help_text="diverged at or after the first step a declared change took effect: changed on purpose; false: "
        "a divergence is still one"
    )


class ParityOutputSerializer(serializers.Serializer):
    verdict = serializers.ChoiceField(choices=ParityVerdict.choices)
    step = serializers.IntegerField(allow_null=True, help_text="diverged: the first step where the runs part")
    key = serializers.SerializerMethodField(help_text="diverged: the key that parts first (the first by name)")
    parent_value = serializers.SerializerMethodField(help_text="diverged: the parent's value at step")
    child_value = serializers.SerializerMethodField(help_text="diverged: this run's value at step")
    tolerance = serializers.FloatField(help_text="relative tolerance the verdict used (the Project's setting)")
    max_difference = ParityValueField(
        allow_null=True, help_text="largest relative difference |child - parent| / max(|child|, |parent|) compared"
    )
    compared_steps = serializers.IntegerField(help_text="steps at which at least one key was compared")
    compared_points = serializers.IntegerField(help_text="(key, step) pairs compared")
    compared_keys = serializers.ListField(child=serializers.CharField(), help_text="keys compared, sorted")
    first_step = serializers.IntegerField(allow_null=True, help_text="lowest compared step")
    last_step = serializers.IntegerField(allow_null=True, help_text="highest compared step")
    checkpoint_step = serializers.IntegerField(help_text="the source checkpoint's step: steps from it on count")
    parent_id = serializers.IntegerField(help_text="the run compared with")
    updated_at = serializers.DateTimeField(allow_null=True)
    declared = serializers.SerializerMethodField(
        help_text="the parameters the resume or continue changed on purpose and whether each took effect; null: "
        "none changed"
    )

    @extend_schema_field(DeclaredOutputSerializer(allow_null=True))
    def get_declared(self, parity) -> dict | None:
        declared = selectors.declared_verdict_of(parity.run, parity)
        return None if declared is None else DeclaredOutputSerializer(declared).data

    def get_key(self, parity) -> str | None:
        return parity.key if parity.verdict == ParityVerdict.DIVERGED else None

    @extend_schema_field(ParityValueField)
    def get_parent_value(self, parity):
        return self._value(parity, parity.parent_value)

    @extend_schema_field(ParityValueField)
    def get_child_value(self, parity):
        return self._value(parity, parity.child_value)

    @staticmethod
    def _value(parity, value):
        if parity.verdict != ParityVerdict.DIVERGED:
            return None
        return ParityValueField().to_representation(math.nan if value is None else value)


class RestoreReportOutputSerializer(serializers.Serializer):
    checkpoint_id = serializers.IntegerField(allow_null=True, help_text="the checkpoint the code loaded")
    not_restored = serializers.ListField(
        child=serializers.CharField(), help_text="parts the checkpoint holds that the code did not restore, sorted"
    )
    unknown = serializers.ListField(child=serializers.CharField(), help_text="parts the SDK could not check")
    not_declared = serializers.ListField(
        child=serializers.CharField(),
        help_text="parts the checkpoint cannot describe (e.g. no data position), sorted; details name the call "
        "that declares each",
    )
    parts = serializers.DictField(
        child=serializers.CharField(),
        help_text='every part checked: "restored", "not_restored", "unknown" or "not_declared"',
    )
    details = serializers.DictField(child=serializers.CharField(), help_text="one line per part, e.g. what differs")
    reported_at = serializers.DateTimeField(help_text="time of the last report (a later one replaces it)")
    reports = serializers.IntegerField(help_text="reports the Run sent")


def parity_of_run(run: Run) -> Parity | None:
    """``run``'s verdict; for a Run started from a checkpoint that logged nothing yet, an unsaved ``unknown`` one;
    None for a Run not started from a checkpoint."""
    parity = selectors.parity_of(run)
    if parity is not None or not (run.parent_id and run.source_checkpoint_id):
        return parity
    return Parity(
        run=run,
        parent_id=run.parent_id,
        checkpoint_step=run.source_checkpoint.step,
        tolerance=selectors.project_tolerance(project_id=run.project_id),
    )


def parity_data(run: Run) -> dict | None:
    parity = parity_of_run(run)
    return None if parity is None else ParityOutputSerializer(parity).data


def restore_report_data(run: Run) -> dict | None:
    report = selectors.restore_report_of(run)
    return None if report is None else RestoreReportOutputSerializer(report).data


class ResumeFactsMixin(serializers.Serializer):
    """``restore_report``, ``resume_ignored_at_step`` and ``parity`` of the Run the serialized object names
    (``run_of``)."""

    restore_report = serializers.SerializerMethodField(
        help_text="what the code restored from its checkpoint, as its SDK reported it; null: no report"
    )
    resume_ignored_at_step = serializers.SerializerMethodField(
        help_text="the first step logged when the code may have ignored the source checkpoint: the step lies below "
        "the checkpoint's, or the checkpoint holds a training state and no restore report came before the first "
        "metrics (a later report clears it); else null"
    )
    parity = serializers.SerializerMethodField(
        help_text="how this run's points compare with its parent's from the checkpoint's step on; null: not "
        "started from a checkpoint"
    )

    @staticmethod
    def run_of(instance) -> Run:
        return instance

    @extend_schema_field(RestoreReportOutputSerializer(allow_null=True))
    def get_restore_report(self, instance) -> dict | None:
        return restore_report_data(self.run_of(instance))

    def get_resume_ignored_at_step(self, instance) -> int | None:
        return selectors.resume_ignored_at_step(self.run_of(instance))

    @extend_schema_field(ParityOutputSerializer(allow_null=True))
    def get_parity(self, instance) -> dict | None:
        return parity_data(self.run_of(instance))


class SegmentRestoreReportOutputSerializer(serializers.Serializer):
    parts = serializers.DictField(
        child=serializers.CharField(),
        help_text='every part checked: "restored", "not_restored", "unknown" or "not_declared"',
    )
    details = serializers.DictField(child=serializers.CharField(), help_text="one line per part, e.g. what differs")
    not_restored = serializers.ListField(child=serializers.CharField(), help_text="parts not restored, sorted")
    unknown = serializers.ListField(child=serializers.CharField(), help_text="parts whose restoring is not known")
    not_declared = serializers.ListField(
        child=serializers.CharField(), help_text="parts the checkpoint cannot describe, so not checked"
    )


class ResumeSegmentOutputSerializer(serializers.Serializer):
    """One resume of a run under its id, and how the steps it logged again compare with the values the run held
    there (the run's curve keeps those first values)."""

    number = serializers.IntegerField(help_text="1 for the first resume under the run id, then 2, …")
    floor = serializers.IntegerField(help_text="the run's step floor this resume set: steps below it are compared")
    checkpoint_id = serializers.IntegerField(allow_null=True, help_text="the checkpoint its restore report names")
    checkpoint_step = serializers.IntegerField(allow_null=True)
    verdict = serializers.ChoiceField(choices=ParityVerdict.choices)
    step = serializers.IntegerField(allow_null=True, help_text="diverged: the first step where the values part")
    key = serializers.SerializerMethodField(help_text="diverged: the first key (by name) that parts there")
    parent_value = serializers.SerializerMethodField(help_text="diverged: the value the run's series holds")
    child_value = serializers.SerializerMethodField(help_text="diverged: the value this resume logged")
    compared_points = serializers.IntegerField(help_text="(key, step) pairs compared")
    compared_keys = serializers.ListField(child=serializers.CharField())
    first_step = serializers.IntegerField(allow_null=True)
    last_step = serializers.IntegerField(allow_null=True)
    max_difference = ParityValueField(allow_null=True, help_text="largest relative difference; null: none compared")
    tolerance = serializers.FloatField(allow_null=True)
    restore_report = serializers.SerializerMethodField(help_text="the restore report this resume sent; null: none")
    declared = serializers.SerializerMethodField(
        help_text="the parameters this resume changed on purpose (allow_param_change), each judged against what it "
        "logged again, as a continue's are: a divergence from the step the change took effect reads changed on "
        "purpose; null: it changed none"
    )

    def get_key(self, segment) -> str | None:
        return segment.key if segment.verdict == ParityVerdict.DIVERGED else None

    @extend_schema_field(ParityValueField)
    def get_parent_value(self, segment):
        return self._value(segment, segment.parent_value)

    @extend_schema_field(ParityValueField)
    def get_child_value(self, segment):
        return self._value(segment, segment.child_value)

    @staticmethod
    def _value(segment, value):
        if segment.verdict != ParityVerdict.DIVERGED:
            return None
        return ParityValueField().to_representation(math.nan if value is None else value)

    @extend_schema_field(DeclaredOutputSerializer(allow_null=True))
    def get_declared(self, segment) -> dict | None:
        declared = self.context.get("segments_declared", {}).get(segment.pk)
        return None if declared is None else DeclaredOutputSerializer(declared).data

    @extend_schema_field(SegmentRestoreReportOutputSerializer(allow_null=True))
    def get_restore_report(self, segment) -> dict | None:
        if segment.restore_parts is None:
            return None
        return {
            "parts": segment.restore_parts,
            "details": segment.restore_details or {},
            "not_restored": segment.not_restored,
            "unknown": segment.unknown,
            "not_declared": segment.not_declared,
        }


class RunResourceOutputSerializer(ResumeFactsMixin, RunOutputSerializer):
    """The Run resource with what it restored and its parity verdict, and each resume under its id's verdict."""

    resume_segments = serializers.SerializerMethodField(
        help_text="each resume of this run under its id, in order, with how the steps it logged again compare with "
        "what the run held (the run's series keeps the first values)",
    )

    @extend_schema_field(ResumeSegmentOutputSerializer(many=True))
    def get_resume_segments(self, run) -> list[dict]:
        pairs = selectors.segments_declared(run=run)
        declared = {segment.pk: verdict for segment, verdict in pairs if verdict is not None}
        segments = [segment for segment, _verdict in pairs]
        return ResumeSegmentOutputSerializer(segments, many=True, context={"segments_declared": declared}).data
