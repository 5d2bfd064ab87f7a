"""Pages of the alerts app: a Project's alerts (rules, channels, deliveries, "send test") and its Reliability page
(docs/design/alerts.md#reliability). Thin (docs/design/house.md#views)."""

from django.contrib import messages
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from alerts import selectors
from alerts.reliability import project_reliability, reliability_json
from alerts.services.rules import channel_test
from mado import policy
from runs import selectors as run_selectors
from runs.views import page

RECENT_DELIVERIES = 20


@page
@require_GET
def project_alerts(request, slug):
    """The Project's alert channels (a failing one first, with its error), rules, your subscriptions and the last
    deliveries; members and admins (viewers 403)."""
    project = run_selectors.project_get_for_user(user=request.user, slug=slug)
    channels = sorted(selectors.channel_list(user=request.user, project=project), key=lambda c: not c.is_failing)
    is_admin = policy.has_role(request.user, project, policy.ADMIN)
    context = {
        "project": project,
        "channels": channels,
        "rules": selectors.rule_list(user=request.user, project=project),
        "is_admin": is_admin,
        "deliveries": selectors.project_deliveries(project=project)[:RECENT_DELIVERIES] if is_admin else [],
    }
    return render(request, "alerts/project_alerts.html", context)


@page
@require_POST
def channel_send_test(request, pk):
    """ "Send test": queue a test message to the channel (admins) and come back to the alerts page."""
    channel = selectors.channel_get_for_user(user=request.user, channel_id=pk)
    channel_test(actor=request.user, channel=channel)
    messages.success(
        request, _("A test message to %(name)s is on its way; its delivery shows below.") % {"name": channel.name}
    )
    return redirect("alerts:project-alerts", channel.project.slug)


@page
@require_GET
def project_reliability_page(request, slug):
    """The Project's Reliability page: GPU-hours lost per week (chart), the ledger, MTBF per queue and the
    checkpoint interval per Code (any member or viewer)."""
    project = run_selectors.project_get_for_user(user=request.user, slug=slug)
    rel = project_reliability(project=project)
    return render(
        request,
        "alerts/project_reliability.html",
        {"project": project, "rel": rel, "chart": reliability_json(rel)["weeks"]},
    )
