"""Managing alert rules and channels, sending a test, and a Run's own alerts (docs/design/alerts.md#rules).

Each write is one service, so an audit log can record it in one place
(actor, Project, what changed). A channel's secret is returned once, by
``channel_create``, and never shown or logged again.
"""

import logging
import secrets
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.utils import timezone

from alerts.evaluate import forget_rules
from alerts.models import METRIC_EVENTS, Channel, ChannelKind, Delivery, Event, Firing, Rule
from alerts.services.firing import alert_fire, delivery_queue
from alerts.ssrf import UrlRefused, check_url
from mado import policy
from mado.audit import audit_record
from mado.errors import Conflict, UserError, ValidationFailed

logger = logging.getLogger("alerts")

RULE_FIELDS = (
    "key",
    "threshold",
    "consecutive",
    "stalled_minutes",
    "kinds",
    "tags",
    "queues",
    "creators",
    "quiet_minutes",
)


class RateLimited(UserError):
    status = 429
    code = "rate_limited"


def _check_rule(event: str, fields: dict) -> None:
    if event not in Event.values:
        raise ValidationFailed(f"unknown event {event!r}; one of {', '.join(Event.values)}", field="event")
    if event in METRIC_EVENTS and not fields.get("key"):
        raise ValidationFailed("a metric condition needs the metric key", field="key")
    if event in (Event.METRIC_ABOVE, Event.METRIC_BELOW) and fields.get("threshold") is None:
        raise ValidationFailed("an above/below condition needs a threshold", field="threshold")
    if event == Event.METRIC_STALLED and not (fields.get("stalled_minutes") or 0) > 0:
        raise ValidationFailed("a stalled-loop condition needs stalled_minutes > 0", field="stalled_minutes")
    for name in ("kinds", "tags", "queues", "creators"):
        value = fields.get(name, [])
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ValidationFailed(f"{name} must be a list of strings", field=name)


@transaction.atomic
def rule_create(
    *, actor, project, name: str, event: str, personal: bool, channel_ids: list[int] = (), **fields
) -> Rule:
    """Create a Project rule (``personal`` False: admins) or ``actor``'s personal subscription (members, admins).

    ``event`` an ``alerts.models.Event`` value; ``fields`` among ``RULE_FIELDS`` (``threshold`` a float,
    ``consecutive`` ≥ 1 points, ``stalled_minutes`` and ``quiet_minutes`` in minutes, the filters lists of
    strings); ``channel_ids`` channels of the same Project (a Project rule only). Raises ``Forbidden`` and
    ``ValidationFailed`` naming the field.
    """
    policy.require_alerts_manager(actor, project, owner_id=actor.pk if personal else None)
    _check_rule(event, fields)
    if not name or len(name) > 100:
        raise ValidationFailed("name must be 1 to 100 characters", field="name")
    channels = list(Channel.objects.filter(project=project, pk__in=list(channel_ids)))
    if len(channels) != len(set(channel_ids)):
        raise ValidationFailed("no such channel in this project", field="channel_ids")
    if personal and channels:
        raise ValidationFailed("a personal subscription is mailed to you; it takes no channels", field="channel_ids")
    rule = Rule.objects.create(
        project=project,
        owner=actor if personal else None,
        name=name,
        event=event,
        created_by=actor,
        **{k: v for k, v in fields.items() if k in RULE_FIELDS and v is not None},
    )
    rule.channels.set(channels)
    transaction.on_commit(lambda: forget_rules(project.pk))
    logger.info("alert rule %s created by %s in %s", rule.pk, actor.username, project.slug)
    audit_record(
        actor=actor,
        action="alert_rule.create",
        obj=rule,
        project_id=rule.project_id,
        changes={"event": [None, rule.event]},
    )
    return rule


@transaction.atomic
def rule_delete(*, actor, rule: Rule) -> None:
    """Delete ``rule`` and its firings: a Project rule by an admin, a subscription by its owner or an admin."""
    policy.require_alerts_manager(actor, rule.project, owner_id=rule.owner_id)
    logger.info("alert rule %s deleted by %s in %s", rule.pk, actor.username, rule.project.slug)
    project_id = rule.project_id
    audit_record(
        actor=actor,
        action="alert_rule.delete",
        obj=rule,
        project_id=rule.project_id,
        changes={"event": [rule.event, None]},
    )
    rule.delete()
    transaction.on_commit(lambda: forget_rules(project_id))


@transaction.atomic
def channel_create(*, actor, project, name: str, kind: str, target: str) -> tuple[Channel, str]:
    """Create a channel of ``project`` (admins); ``(channel, secret)``: the webhook's secret, shown this once ("" for
    other kinds). A URL that reaches inward is refused (``ValidationFailed`` on ``target`` with the reason)."""
    policy.require_alerts_manager(actor, project, owner_id=None)
    if kind not in ChannelKind.values:
        raise ValidationFailed(f"unknown kind {kind!r}; one of {', '.join(ChannelKind.values)}", field="kind")
    if kind == ChannelKind.EMAIL:
        try:
            for address in target.split(","):
                validate_email(address.strip())
        except ValidationError as exc:
            raise ValidationFailed(f"not an email address: {address.strip()!r}", field="target") from exc
    else:
        try:
            check_url(target)
        except UrlRefused as exc:
            raise ValidationFailed(f"channel {name!r}: {exc}", field="target") from exc
    secret = secrets.token_urlsafe(32) if kind == ChannelKind.WEBHOOK else ""
    try:
        with transaction.atomic():
            channel = Channel.objects.create(
                project=project, name=name, kind=kind, target=target, secret=secret, created_by=actor
            )
    except IntegrityError as exc:
        raise Conflict(f"a channel named {name!r} exists in this project", field="name") from exc
    logger.info("alert channel %s (%s) created by %s in %s", channel.pk, kind, actor.username, project.slug)
    audit_record(
        actor=actor, action="alert_channel.create", obj=channel, project_id=project.pk, changes={"kind": [None, kind]}
    )
    return channel, secret


@transaction.atomic
def channel_delete(*, actor, channel: Channel) -> None:
    """Delete ``channel`` (admins) with its delivery log; the rules that sent to it stop sending there (a rule left
    with no channel sends nowhere). A delivery still queued for it is dropped when its turn comes."""
    policy.require_alerts_manager(actor, channel.project, owner_id=None)
    project_id = channel.project_id
    logger.info("alert channel %s deleted by %s in %s", channel.pk, actor.username, channel.project.slug)
    audit_record(
        actor=actor,
        action="alert_channel.delete",
        obj=channel,
        project_id=project_id,
        changes={"kind": [channel.kind, None]},
    )
    channel.delete()
    transaction.on_commit(lambda: forget_rules(project_id))


@transaction.atomic
def channel_test(*, actor, channel: Channel) -> Delivery:
    """Queue a test message to ``channel`` (admins); the Delivery, recorded in the channel's log as any other."""
    policy.require_alerts_manager(actor, channel.project, owner_id=None)
    payload = {
        "schema": "mado.alert/v1",
        "event": "test",
        "project": channel.project.slug,
        "rule": None,
        "title": f"Test message from mado to {channel.name}",
        "text": f"Sent by {actor.username}: this channel works.",
        "level": "info",
        "condition": "test",
        "fired_at": timezone.now().isoformat(),
        "run": None,
    }
    delivery = Delivery.objects.create(channel=channel, payload=payload)
    delivery_queue(delivery=delivery)
    return delivery


@transaction.atomic
def run_alert_send(*, actor, run, title: str, text: str = "", level: str = "warn") -> list[Firing]:
    """An alert from ``run``'s own code (``run.alert``): the Project's ``run_alert`` rules fire with it.

    Only writers of the Run (``policy.require_run_writer``). At most ``MADO_ALERT_RUN_RATE`` alerts per minute
    per Run (``RateLimited``, 429). ``level`` is info, warn or error. Returns the firings (empty when no rule
    listens).
    """
    policy.require_run_writer(actor, run)
    if not title or len(title) > 300:
        raise ValidationFailed("title must be 1 to 300 characters", field="title")
    if level not in ("info", "warn", "error"):
        raise ValidationFailed("level must be info, warn or error", field="level")
    recent = Firing.objects.filter(
        run=run, rule__event=Event.RUN_ALERT, fired_at__gte=timezone.now() - timedelta(minutes=1)
    )
    if recent.values("condition").distinct().count() >= settings.MADO_ALERT_RUN_RATE:
        raise RateLimited(
            f"more than {settings.MADO_ALERT_RUN_RATE} alerts a minute from this run; wait a minute", field="title"
        )
    condition = f"alert {secrets.token_hex(8)}"
    rules = Rule.objects.filter(project_id=run.project_id, event=Event.RUN_ALERT, enabled=True).select_related(
        "project", "owner"
    )
    fired = [alert_fire(rule=rule, run=run, condition=condition, title=title, text=text, level=level) for rule in rules]
    return [firing for firing in fired if firing is not None]
