"""Forms of the pages: they parse and validate input; services decide (docs/design/house.md#views)."""

from django import forms
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from mado.templatetags.mado_ui import LABELS
from runs.models import Role, RunKind, RunStatus

ROLE_CHOICES = [(code, LABELS["role"][code]) for code in Role.values]


class RunFilterForm(forms.Form):
    """The Runs table's GET filters; an empty value means "any"."""

    status = forms.ChoiceField(
        label=_("Status"),
        required=False,
        choices=[("", pgettext_lazy("filter", "any status"))]
        + [(code, LABELS["status"][code]) for code in RunStatus.values],
    )
    kind = forms.ChoiceField(
        label=_("Kind"),
        required=False,
        choices=[("", pgettext_lazy("filter", "any kind"))] + [(code, LABELS["kind"][code]) for code in RunKind.values],
    )
    creator = forms.CharField(label=_("Created by"), required=False, max_length=150)
    tag = forms.CharField(label=_("Tag"), required=False, max_length=500, help_text=_("KEY or KEY:VALUE"))
    q = forms.CharField(label=_("Search"), required=False, max_length=1000)
    sort = forms.CharField(label=_("Sort"), required=False, max_length=600)


class DatasetVersionChoiceField(forms.ModelMultipleChoiceField):
    """A multi-select of dataset versions labelled ``dataset:version`` (Launch Job, continue, data stages)."""

    def label_from_instance(self, obj):
        return f"{obj.dataset.name}:{obj.version}"


class CheckpointChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj):
        return _("step %(step)s") % {"step": obj.step}


class DataStageRecordForm(forms.Form):
    """ "Record data change" (docs/design/runs.md#data-stages): the step where the new data starts and the full set of
    versions from it.

    ``versions`` is the Project's dataset versions to choose from,
    ``composition`` the set in force now (preselected), ``checkpoints`` the
    Run's complete checkpoints. The service decides everything else (order of
    steps, conflicts, the Run's state); its error fields map onto these fields.
    """

    SERVICE_FIELDS = {
        "dataset_version_ids": "input_dataset_version_ids",
        "checkpoint_id": "checkpoint",
        "metadata": "note",
    }

    start_step = forms.IntegerField(
        label=_("Start step"),
        min_value=0,
        help_text=_("The first step trained on the new data mix. Switch the data loader first, then record it."),
    )
    input_dataset_version_ids = DatasetVersionChoiceField(
        label=_("Dataset versions from this step"),
        queryset=None,
        widget=forms.SelectMultiple(attrs={"size": 6}),
        help_text=_("The full set in force from the start step: keep the versions that stay, add the new ones."),
    )
    checkpoint = CheckpointChoiceField(
        label=_("Checkpoint"),
        queryset=None,
        required=False,
        empty_label=_("none"),
        help_text=_("Optional: the checkpoint of this run the new data mix starts from."),
    )
    note = forms.CharField(label=_("Note"), max_length=500, required=False)

    def __init__(self, *args, versions, composition, checkpoints, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["input_dataset_version_ids"].queryset = versions
        self.fields["input_dataset_version_ids"].initial = [version.pk for version in composition]
        self.fields["checkpoint"].queryset = checkpoints

    def service_arguments(self) -> dict:
        """The keyword arguments of ``runs.services.data_stage_record`` (without ``actor`` and ``run``)."""
        data = self.cleaned_data
        return {
            "start_step": data["start_step"],
            "dataset_version_ids": [version.pk for version in data["input_dataset_version_ids"]],
            "checkpoint_id": data["checkpoint"].pk if data["checkpoint"] else None,
            "metadata": {"note": data["note"]} if data["note"] else {},
        }


class MemberAddForm(forms.Form):
    username = forms.CharField(label=_("Username"), max_length=150)
    role = forms.ChoiceField(label=_("Role"), choices=ROLE_CHOICES, initial=Role.MEMBER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(label=_("Role"), choices=ROLE_CHOICES)


def add_service_error(form: forms.Form, error) -> None:
    """Show a service's ``UserError`` on ``form``: on its field when the form has it (``SERVICE_FIELDS`` maps a
    service's argument name onto a form field), else above the form."""
    field = getattr(form, "SERVICE_FIELDS", {}).get(error.field, error.field)
    form.add_error(field if field in form.fields else None, error.detail)
