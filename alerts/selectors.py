"""Reads of the alerts app (docs/design/house.md#where-logic-goes): lookups within the user's Projects."""

from urllib.parse import urlsplit

from django.db.models import Q, QuerySet

from alerts.models import Channel, ChannelKind, Delivery, Rule
from mado import policy
from mado.errors import Forbidden, NotFound
from runs.models import Project


def rule_list(*, user, project) -> QuerySet[Rule]:
    """The Project's rules and ``user``'s own subscriptions (members and admins; viewers ``Forbidden``)."""
    _require_member(user, project)
    return (
        Rule.objects.filter(project=project)
        .filter(Q(owner__isnull=True) | Q(owner=user))
        .prefetch_related("channels")
        .order_by("pk")
    )


def rule_get_for_user(*, user, rule_id: int) -> Rule:
    """Rule ``rule_id`` of one of ``user``'s Projects (another's subscription or Project: ``NotFound``)."""
    rule = Rule.objects.filter(project__in=_projects(user), pk=rule_id).select_related("project").first()
    if rule is None or (rule.owner_id not in (None, user.pk) and not policy.has_role(user, rule.project, policy.ADMIN)):
        raise NotFound(f"no alert rule {rule_id} in your projects", field="rule_id")
    return rule


def channel_list(*, user, project) -> QuerySet[Channel]:
    """The Project's channels (members and admins read them; viewers ``Forbidden``)."""
    _require_member(user, project)
    return Channel.objects.filter(project=project).select_related("project").order_by("name")


def channel_target_shown(channel: Channel, *, user) -> str:
    """What ``user`` is shown of ``channel``'s target (docs/design/alerts.md#channels): the whole of it for the
    Project's admins; for others a URL is cut to its scheme and host (a chat webhook's path is its credential:
    whoever holds it posts to the channel), e-mail addresses are shown."""
    if channel.kind == ChannelKind.EMAIL or policy.has_role(user, channel.project, policy.ADMIN):
        return channel.target
    parts = urlsplit(channel.target)
    return f"{parts.scheme}://{parts.hostname}/…" if parts.scheme and parts.hostname else "…"


def channel_get_for_user(*, user, channel_id: int) -> Channel:
    """Channel ``channel_id`` of one of ``user``'s Projects, else ``NotFound``."""
    channel = Channel.objects.filter(project__in=_projects(user), pk=channel_id).select_related("project").first()
    if channel is None:
        raise NotFound(f"no alert channel {channel_id} in your projects", field="channel_id")
    return channel


def delivery_list(*, user, channel: Channel) -> QuerySet[Delivery]:
    """The channel's delivery log, newest first (admins only: it shows where alerts go)."""
    reason = policy.why_not(user, channel.project, policy.ADMIN)
    if reason:
        raise Forbidden(reason)
    return Delivery.objects.filter(channel=channel).select_related("firing__rule").order_by("-created_at", "-pk")


def project_deliveries(*, project) -> QuerySet[Delivery]:
    """The deliveries to ``project``'s channels, newest first (callers check the reader may see them)."""
    return (
        Delivery.objects.filter(channel__project=project)
        .select_related("channel", "firing__rule")
        .order_by("-created_at", "-pk")
    )


def failing_channels(*, project) -> QuerySet[Channel]:
    """Channels of ``project`` whose last delivery failed (the Project page shows them)."""
    return Channel.objects.filter(project=project, last_status="failed").order_by("name")


def _projects(user):
    return Project.objects.visible_to(user)


def _require_member(user, project) -> None:
    reason = policy.why_not(user, project, policy.MEMBER)
    if reason:
        raise Forbidden(reason)
