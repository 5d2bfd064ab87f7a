"""A rule fires: once per Run and condition, its deliveries queued through the outbox (docs/design/alerts.md#rules).

Callers are the event receivers, the metric evaluation, the stalled-loop
check and the Run's own alerts; none of them may fail the work that told
them (``fire_safely``).
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from alerts.models import Delivery, Firing, Rule
from mado import outbox

logger = logging.getLogger("alerts")

DELIVER_TASK = "alerts.tasks.deliver"


def rule_matches(rule: Rule, run) -> bool:
    """True when ``run`` passes ``rule``'s filters (kind, creator, queue, tags; an empty filter passes all)."""
    if run is None:
        return not (rule.kinds or rule.creators or rule.queues or rule.tags)
    if rule.kinds and run.kind not in rule.kinds:
        return False
    if rule.creators and run.created_by.username not in rule.creators:
        return False
    if rule.queues:
        job = getattr(run, "job", None) if run.ran_as_job else None
        if job is None or job.queue.name not in rule.queues:
            return False
    if rule.tags:
        have = dict(run.tags.values_list("key", "value"))
        for tag in rule.tags:
            key, _, value = tag.partition("=")
            if key not in have or (value and have[key] != value):
                return False
    return True


def payload_for(*, rule: Rule, run, firing: Firing, event: str) -> dict:
    """The versioned body every channel is sent (``schema`` ``mado.alert/v1``; docs/design/alerts.md#payload)."""
    body = {
        "schema": "mado.alert/v1",
        "event": event,
        "project": rule.project.slug,
        "rule": {"id": rule.pk, "name": rule.name},
        "title": firing.title,
        "text": firing.text,
        "level": firing.level,
        "condition": firing.condition,
        "fired_at": firing.fired_at.isoformat(),
        "run": None,
    }
    if run is not None:
        body["run"] = {
            "id": run.pk,
            "external_id": run.external_id,
            "name": run.name,
            "status": run.status,
            "url": settings.MADO_PUBLIC_URL.rstrip("/") + reverse("runs:run-detail", args=[run.pk]),
        }
    return body


def _quiet(rule: Rule, now) -> bool:
    if not rule.quiet_minutes:
        return False
    since = now - timedelta(minutes=rule.quiet_minutes)
    return rule.firings.filter(quieted=False, fired_at__gte=since).exists()


def delivery_queue(*, delivery: Delivery) -> None:
    """Queue the next attempt of ``delivery`` through the outbox (call inside a transaction)."""
    outbox.dispatch_create(
        task=DELIVER_TASK,
        args=[delivery.pk, delivery.attempts + 1],
        queue=settings.MADO_MAINTENANCE_QUEUE,
        task_id=f"alert-delivery-{delivery.idempotency_id}-{delivery.attempts + 1}",
    )


@transaction.atomic
def alert_fire(*, rule: Rule, run, condition: str, title: str, text: str = "", level: str = "warn") -> Firing | None:
    """Record that ``rule`` fired for ``run`` (a ``runs.Run`` or None) on ``condition`` and queue its deliveries.

    Returns the Firing, or None when the Run fails the rule's filters or the
    rule already fired for this Run and condition (a database constraint: two
    batches at once fire once). Inside the rule's quiet period the firing is
    recorded ``quieted`` and sent nowhere. A Project rule goes to its
    channels, a personal subscription to its owner's email address.
    """
    if not rule_matches(rule, run):
        return None
    now = timezone.now()
    try:
        with transaction.atomic():
            firing = Firing.objects.create(
                rule=rule,
                run=run,
                condition=condition[:300],
                title=title[:300],
                text=text,
                level=level,
                quieted=_quiet(rule, now),
            )
    except IntegrityError:
        return None
    if firing.quieted:
        return firing
    payload = payload_for(rule=rule, run=run, firing=firing, event=rule.event)
    targets = [{"channel": channel} for channel in rule.channels.all()]
    if rule.owner_id is not None and rule.owner.email:
        targets.append({"email": rule.owner.email})
    for target in targets:
        delivery_queue(delivery=Delivery.objects.create(firing=firing, payload=payload, **target))
    logger.info("alert rule %s fired for run %s: %s", rule.pk, getattr(run, "pk", None), condition)
    return firing


def fire_safely(**kwargs) -> Firing | None:
    """``alert_fire`` in its own savepoint; an error is logged and swallowed: an alert never fails the Run's work."""
    try:
        with transaction.atomic():
            return alert_fire(**kwargs)
    except Exception:  # noqa: BLE001 - the reaper, a metrics batch or a Job's end must go on
        logger.exception(
            "alert rule %s could not fire for run %s", kwargs["rule"].pk, getattr(kwargs["run"], "pk", None)
        )
        return None


def rules_for(*, project_id: int, event: str) -> list[Rule]:
    """The enabled rules of Project ``project_id`` on ``event``, with what firing them reads."""
    return list(
        Rule.objects.filter(project_id=project_id, event=event, enabled=True).select_related("project", "owner")
    )
