"""Pages of the alerts app: a Project's alerts (rules, channels, deliveries, "send test", and forms that add and
delete rules and add channels) and its Reliability page (docs/design/alerts.md#reliability). Thin
(docs/design/house.md#views)."""

from django.contrib import messages
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from alerts import selectors
from alerts.forms import ChannelForm, RuleForm
from alerts.reliability import project_reliability, reliability_json
from alerts.services.rules import channel_create, channel_delete, channel_test, rule_create, rule_delete
from mado import policy
from mado.errors import Conflict, ValidationFailed
from runs import selectors as run_selectors
from runs.forms import add_service_error
from runs.views import page

RECENT_DELIVERIES = 20
SERVICE_FORM_ERRORS = (ValidationFailed, Conflict)


def _alerts_page(request, project, *, rule_form=None, channel_form=None, new_secret="", status=200):
    """The alerts page of ``project``, with the forms as given (bound, showing their errors) or empty."""
    channels = sorted(selectors.channel_list(user=request.user, project=project), key=lambda c: not c.is_failing)
    for channel in channels:
        channel.shown_target = selectors.channel_target_shown(channel, user=request.user)
    is_admin = policy.has_role(request.user, project, policy.ADMIN)
    context = {
        "project": project,
        "channels": channels,
        "rules": selectors.rule_list(user=request.user, project=project),
        "is_admin": is_admin,
        "deliveries": selectors.project_deliveries(project=project)[:RECENT_DELIVERIES] if is_admin else [],
        "rule_form": rule_form or RuleForm(channels=channels, initial={"personal": not is_admin}),
        "channel_form": channel_form or ChannelForm(),
        "new_secret": new_secret,
    }
    return render(request, "alerts/project_alerts.html", context, status=status)


@page
@require_GET
def project_alerts(request, slug):
    """The Project's alert channels (a failing one first, with its error), rules, your subscriptions, the last
    deliveries and the forms to add rules (members: subscriptions) and channels (admins); viewers 403."""
    return _alerts_page(request, run_selectors.project_get_for_user(user=request.user, slug=slug))


@page
@require_POST
def rule_add(request, slug):
    """Add the rule of the form (``rule_create``): a Project rule (admins) or your subscription (members); the page
    again with the reasons when refused (400 / 409), else back to it."""
    project = run_selectors.project_get_for_user(user=request.user, slug=slug)
    form = RuleForm(request.POST, channels=selectors.channel_list(user=request.user, project=project))
    if not form.is_valid():
        return _alerts_page(request, project, rule_form=form, status=400)
    try:
        rule = rule_create(actor=request.user, project=project, **form.rule_arguments())
    except SERVICE_FORM_ERRORS as exc:
        add_service_error(form, exc)
        return _alerts_page(request, project, rule_form=form, status=exc.status)
    messages.success(request, _("Rule %(name)s added.") % {"name": rule.name})
    return redirect("alerts:project-alerts", project.slug)


@page
@require_POST
def rule_remove(request, pk):
    """Delete a rule (``rule_delete``: a Project rule by an admin, a subscription by its owner) and come back."""
    rule = selectors.rule_get_for_user(user=request.user, rule_id=pk)
    rule_delete(actor=request.user, rule=rule)
    messages.success(request, _("Rule %(name)s deleted.") % {"name": rule.name})
    return redirect("alerts:project-alerts", rule.project.slug)


@page
@require_POST
def channel_add(request, slug):
    """Add the channel of the form (``channel_create``, admins). A webhook's signing secret is shown on the page
    this once (200); other kinds go back to the page. Refused: the page again with the reason."""
    project = run_selectors.project_get_for_user(user=request.user, slug=slug)
    form = ChannelForm(request.POST)
    if not form.is_valid():
        return _alerts_page(request, project, channel_form=form, status=400)
    try:
        channel, secret = channel_create(actor=request.user, project=project, **form.cleaned_data)
    except SERVICE_FORM_ERRORS as exc:
        add_service_error(form, exc)
        return _alerts_page(request, project, channel_form=form, status=exc.status)
    messages.success(request, _("Channel %(name)s added: send it a test below.") % {"name": channel.name})
    if secret:
        return _alerts_page(request, project, new_secret=secret)
    return redirect("alerts:project-alerts", project.slug)


@page
@require_POST
def channel_remove(request, pk):
    """Delete a channel (``channel_delete``, admins) and come back to the alerts page."""
    channel = selectors.channel_get_for_user(user=request.user, channel_id=pk)
    channel_delete(actor=request.user, channel=channel)
    messages.success(request, _("Channel %(name)s deleted.") % {"name": channel.name})
    return redirect("alerts:project-alerts", channel.project.slug)


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
