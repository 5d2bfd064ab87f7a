"""Template tags of the alerts app for the pages of lower apps (a template loads them; no Python import upward):
failing channels on the Project page, the lost work a resumed Run restarted from (docs/design/alerts.md#reliability)."""

from django import template

from alerts import selectors
from alerts.reliability import project_reliability

register = template.Library()


@register.simple_tag
def failing_alert_channels(project):
    """The channels of ``project`` whose last delivery failed."""
    return list(selectors.failing_channels(project=project))


@register.simple_tag
def lost_work_of_parent(run):
    """The ledger entry of ``run``'s parent when ``run`` resumed it after a loss, else None."""
    if not run.parent_id:
        return None
    ledger = project_reliability(project=run.project).ledger
    return next((lost for lost in ledger if lost.run_id == run.parent_id and lost.resumed_by == run.pk), None)
