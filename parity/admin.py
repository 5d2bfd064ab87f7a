"""Django admin of the parity app (docs/design/interfaces.md#surfaces): a Project's tolerance is set here (through
``parity_tolerance_set``, which compares the Project's verdicts again); verdicts and restore reports are shown
read-only (only services write them)."""

from django.contrib import admin, messages

from mado.admin import ReadOnlyAdmin
from mado.errors import UserError
from parity.models import Parity, ParityBlock, ParitySettings, RestoreReport
from parity.services import parity_tolerance_set
from runs.models import ResumeSegment, SegmentPoint
from runs.segments import bits_to_values


@admin.register(ParitySettings)
class ParitySettingsAdmin(admin.ModelAdmin):
    list_display = ["project", "tolerance", "updated_at"]
    search_fields = ["project__slug", "project__name"]
    raw_id_fields = ["project"]
    readonly_fields = ["updated_at"]

    def save_model(self, request, obj, form, change):
        """Through the service: checks the value, then compares the Project's verdicts again."""
        try:
            parity_tolerance_set(actor=None, project=obj.project, tolerance=obj.tolerance)
        except UserError as exc:
            messages.error(request, f"{exc.field}: {exc.detail}")


@admin.register(Parity)
class ParityAdmin(ReadOnlyAdmin):
    list_display = ["run", "parent", "verdict", "step", "key", "checkpoint_step", "compared_steps", "updated_at"]
    list_filter = ["verdict"]
    search_fields = ["run__external_id", "parent__external_id", "key"]
    list_select_related = ["run", "parent"]


@admin.register(ParityBlock)
class ParityBlockAdmin(ReadOnlyAdmin):
    list_display = ["parity", "key", "block", "compared", "identical", "diverged_step", "max_difference"]
    search_fields = ["key"]
    list_select_related = ["parity"]


@admin.register(RestoreReport)
class RestoreReportAdmin(ReadOnlyAdmin):
    list_display = ["run", "checkpoint", "reported_at", "reports"]
    search_fields = ["run__external_id"]
    list_select_related = ["run"]


@admin.register(ResumeSegment)
class ResumeSegmentAdmin(ReadOnlyAdmin):
    """Each resume under a run id and its verdict (docs/design/resume.md#same-run-parity): written by services only."""

    list_display = ["run", "number", "floor", "checkpoint_step", "verdict", "step", "key", "compared_points"]
    list_filter = ["verdict"]
    search_fields = ["run__external_id", "key"]
    list_select_related = ["run"]


@admin.register(SegmentPoint)
class SegmentPointAdmin(ReadOnlyAdmin):
    """The points a resume logged again below its floor (docs/design/resume.md#same-run-parity), read-only."""

    list_display = ["segment", "key", "step", "value"]
    search_fields = ["segment__run__external_id", "key"]
    list_select_related = ["segment__run"]

    @admin.display(description="value")
    def value(self, point: SegmentPoint) -> str:
        return repr(float(bits_to_values([point.value_bits])[0]))
