"""Forms of the pages: they parse and validate input; services decide (STYLE: What a view may do)."""

from django import forms
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from runs.models import Role, RunKind, RunStatus
from runs.templatetags.mado_ui import LABELS

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


class MemberAddForm(forms.Form):
    username = forms.CharField(label=_("Username"), max_length=150)
    role = forms.ChoiceField(label=_("Role"), choices=ROLE_CHOICES, initial=Role.MEMBER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(label=_("Role"), choices=ROLE_CHOICES)


def add_service_error(form: forms.Form, error) -> None:
    """Show a service's ``UserError`` on ``form``: on its field when the form has it, else above the form."""
    field = error.field if error.field in form.fields else None
    form.add_error(field, error.detail)
