"""Template helpers of the mado pages: translated labels of stored codes, durations, htmx presence."""

import json

from django import template
from django.contrib.staticfiles import finders
from django.contrib.staticfiles.storage import staticfiles_storage
from django.http import QueryDict
from django.utils import timezone
from django.utils.translation import gettext, pgettext_lazy

register = template.Library()

# Stored values stay English codes; only their display is translated.
LABELS = {
    "status": {
        "pending": pgettext_lazy("run status", "pending"),
        "running": pgettext_lazy("run status", "running"),
        "finished": pgettext_lazy("run status", "finished"),
        "failed": pgettext_lazy("run status", "failed"),
        "aborted": pgettext_lazy("run status", "aborted"),
        "crashed": pgettext_lazy("run status", "crashed"),
        "preempting": pgettext_lazy("run status", "preempting"),
        "preempted": pgettext_lazy("run status", "preempted"),
    },
    "kind": {
        "training": pgettext_lazy("run kind", "training"),
        "fine_tuning": pgettext_lazy("run kind", "fine-tuning"),
        "evaluation": pgettext_lazy("run kind", "evaluation"),
        "other": pgettext_lazy("run kind", "other"),
    },
    "role": {
        "admin": pgettext_lazy("project role", "admin"),
        "member": pgettext_lazy("project role", "member"),
        "viewer": pgettext_lazy("project role", "viewer"),
    },
    "job_status": {
        "queued": pgettext_lazy("job status", "queued"),
        "running": pgettext_lazy("job status", "running"),
        "succeeded": pgettext_lazy("job status", "succeeded"),
        "failed": pgettext_lazy("job status", "failed"),
        "aborted": pgettext_lazy("job status", "aborted"),
        "preempted": pgettext_lazy("job status", "preempted"),
    },
    # The Jobs list's badges (docs/design/resume.md#from-a-checkpoint): a resume Job is "resumed".
    "job_kind": {
        "new": pgettext_lazy("job kind", "new"),
        "resume": pgettext_lazy("job kind", "resumed"),
        "continue": pgettext_lazy("job kind", "continued"),
        "retry": pgettext_lazy("job kind", "retry"),
    },
    # Sweeps (docs/design/sweeps.md#sweeps, #requeue): a trial's state and a sweep's search method.
    "trial_state": {
        "queued": pgettext_lazy("trial state", "queued"),
        "leased": pgettext_lazy("trial state", "claimed"),
        "running": pgettext_lazy("trial state", "running"),
        "done": pgettext_lazy("trial state", "done"),
    },
    "sweep_method": {
        "grid": pgettext_lazy("sweep method", "grid"),
        "random": pgettext_lazy("sweep method", "random"),
        "bayes": pgettext_lazy("sweep method", "Bayesian (TPE)"),
    },
    "metric_goal": {
        "minimize": pgettext_lazy("metric goal", "minimize"),
        "maximize": pgettext_lazy("metric goal", "maximize"),
    },
}

HTMX_FILE = "htmx.min.js"


@register.filter
def label(value, family: str):
    """The translated display of a stored code: ``{{ run.status|label:"status" }}``; unknown codes as is."""
    return LABELS.get(family, {}).get(value, value)


@register.filter
def duration(seconds):
    """Seconds as ``2h 03m``, ``4m 05s`` or ``12s``; empty for None."""
    if seconds is None:
        return ""
    total = int(round(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return gettext("%(d)dd %(h)02dh") % {"d": days, "h": hours}
    if hours:
        return gettext("%(h)dh %(m)02dm") % {"h": hours, "m": minutes}
    if minutes:
        return gettext("%(m)dm %(s)02ds") % {"m": minutes, "s": secs}
    return gettext("%(s)ds") % {"s": secs}


@register.filter
def run_duration(run):
    """A Run's duration for display: start to end once final, start to now while it goes on."""
    if run.started_at and not run.ended_at and not run.is_final:
        return duration((timezone.now() - run.started_at).total_seconds())
    return duration(run.duration_seconds)


@register.filter
def as_json(value):
    """A parameter value for display: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


@register.simple_tag
def htmx_available() -> bool:
    """True when htmx can be served (``npm ci`` ran, or collectstatic copied it); pages work without it."""
    return asset_available(HTMX_FILE)


@register.simple_tag
def asset_available(name: str) -> bool:
    """True when the static file ``name`` (an npm package's, package.json) can be served."""
    return bool(finders.find(name)) or staticfiles_storage.exists(name)


@register.filter
def cell(run, column) -> str:
    """A runs-table cell: the value of ``column`` (``runs.table.Column``) on ``run``; numbers to 6 significant
    digits, missing as an empty string."""
    value = getattr(run, column.alias, None)
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list, bool)):
        return json.dumps(value)
    return str(value)


@register.simple_tag
def sort_link(query: str, current: str, column: str) -> str:
    """The query string that sorts by ``column``: ascending, or descending when it is already ascending."""
    params = QueryDict(query, mutable=True)
    params.pop("page", None)
    params["sort"] = f"-{column}" if current == column else column
    return params.urlencode()
