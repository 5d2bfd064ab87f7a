"""The alerts page's forms: a new rule or subscription, a new channel (docs/design/alerts.md#rules).

They parse what a browser sends (numbers, comma-separated filters, the chosen channels); the rules of what a
rule or a channel may be are the services' (``alerts.services.rules``), whose errors the page shows on the field
they name.
"""

from django import forms
from django.utils.translation import gettext_lazy as _lazy

from alerts.models import Channel, ChannelKind, Event

FILTERS = ("kinds", "tags", "queues", "creators")


class RuleForm(forms.Form):
    """A Project rule (admins) or, with ``personal``, a subscription mailed to you (members)."""

    SERVICE_FIELDS = {"channel_ids": "channels"}

    name = forms.CharField(label=_lazy("Name"), max_length=100)
    event = forms.ChoiceField(label=_lazy("When"), choices=Event.choices)
    personal = forms.BooleanField(label=_lazy("Mail it to me (a personal subscription)"), required=False)
    key = forms.CharField(label=_lazy("Metric key"), max_length=200, required=False)
    threshold = forms.FloatField(label=_lazy("Threshold"), required=False)
    consecutive = forms.IntegerField(label=_lazy("Consecutive points"), min_value=1, required=False)
    stalled_minutes = forms.FloatField(label=_lazy("No new point for (minutes)"), min_value=0, required=False)
    quiet_minutes = forms.FloatField(label=_lazy("Quiet period (minutes)"), min_value=0, required=False)
    kinds = forms.CharField(label=_lazy("Run kinds"), max_length=500, required=False)
    tags = forms.CharField(label=_lazy("Tags (key or key=value)"), max_length=500, required=False)
    queues = forms.CharField(label=_lazy("Queues"), max_length=500, required=False)
    creators = forms.CharField(label=_lazy("Creators"), max_length=500, required=False)
    channels = forms.TypedMultipleChoiceField(label=_lazy("Send to"), coerce=int, required=False)

    def __init__(self, *args, channels=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["channels"].choices = [(channel.pk, channel.name) for channel in channels]

    def rule_arguments(self) -> dict:
        """The keyword arguments of ``rule_create`` (after ``is_valid``): the filters as lists, no empty numbers."""
        data = self.cleaned_data
        arguments = {"name": data["name"], "event": data["event"], "personal": data["personal"]}
        arguments["channel_ids"] = data["channels"]
        for name in ("key", "threshold", "consecutive", "stalled_minutes", "quiet_minutes"):
            if data[name] not in (None, ""):
                arguments[name] = data[name]
        for name in FILTERS:
            arguments[name] = [item.strip() for item in data[name].split(",") if item.strip()]
        return arguments


class ChannelForm(forms.Form):
    """A channel of the Project (admins): email addresses, or the URL of a webhook or a chat's incoming hook."""

    name = forms.CharField(label=_lazy("Name"), max_length=Channel._meta.get_field("name").max_length)
    kind = forms.ChoiceField(label=_lazy("Kind"), choices=ChannelKind.choices)
    target = forms.CharField(label=_lazy("Addresses or URL"), max_length=Channel._meta.get_field("target").max_length)
