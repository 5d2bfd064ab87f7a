"""One attempt of a delivery, its retries with backoff, and giving up (docs/design/alerts.md#delivery).

At least once: an attempt is claimed with a conditional UPDATE on its
number (two messages for one attempt send it once), the outcome is
recorded on the row (the delivery log: attempts, last HTTP status, error),
and a failed attempt waits ``MADO_ALERT_RETRY_SECONDS`` × 2^(attempt−1)
(capped at an hour) before ``deliveries_retry_due`` (beat) queues the next
one through the outbox, until ``MADO_ALERT_MAX_ATTEMPTS``. A refused URL is
not retried. Every attempt carries the same idempotency id.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from alerts import channels
from alerts.models import Channel, Delivery, DeliveryStatus
from alerts.services.firing import delivery_queue
from alerts.ssrf import UrlRefused

logger = logging.getLogger("alerts")

OPEN = (DeliveryStatus.PENDING, DeliveryStatus.RETRYING)


def backoff(attempts: int) -> timedelta:
    """The wait after ``attempts`` failed attempts: ``MADO_ALERT_RETRY_SECONDS`` doubled each time, ≤ 1 h."""
    return timedelta(seconds=min(settings.MADO_ALERT_RETRY_SECONDS * 2 ** (attempts - 1), 3600))


def delivery_waits(args: list) -> bool:
    """Outbox hook: the attempt ``args[1]`` of Delivery ``args[0]`` has not been made yet."""
    return Delivery.objects.filter(pk=args[0], status__in=OPEN, attempts__lt=args[1]).exists()


def delivery_give_up(args: list, reason: str) -> None:
    """Outbox hook: no worker took the attempt's message; the delivery ends ``failed`` with ``reason`` (gone with its
    deleted channel: nothing to record)."""
    delivery = Delivery.objects.filter(pk=args[0]).first()
    if delivery is not None:
        _record_failure(delivery, f"not sent: {reason}", final=True)


def _claim(delivery_id: int, attempt: int) -> Delivery | None:
    claimed = Delivery.objects.filter(pk=delivery_id, status__in=OPEN, attempts=attempt - 1).update(
        attempts=attempt, last_attempt_at=timezone.now(), next_attempt_at=None
    )
    return Delivery.objects.select_related("channel", "firing__rule").get(pk=delivery_id) if claimed else None


def _channel_outcome(channel: Channel | None, status: str, error: str = "") -> None:
    if channel is not None:
        Channel.objects.filter(pk=channel.pk).update(
            last_status=status, last_error=error, last_delivery_at=timezone.now()
        )


@transaction.atomic
def _record_failure(delivery: Delivery, error: str, *, final: bool, http_status: int | None = None) -> None:
    final = final or delivery.attempts >= settings.MADO_ALERT_MAX_ATTEMPTS
    Delivery.objects.filter(pk=delivery.pk).update(
        status=DeliveryStatus.FAILED if final else DeliveryStatus.RETRYING,
        error=error[:2000],
        response_status=http_status,
        next_attempt_at=None if final else timezone.now() + backoff(delivery.attempts),
    )
    _channel_outcome(delivery.channel, "failed", error[:2000])


def _rule_name(delivery: Delivery) -> str:
    return delivery.firing.rule.name if delivery.firing else "send test"


def delivery_attempt(*, delivery_id: int, attempt: int) -> str | None:
    """Make attempt number ``attempt`` (1-based) of Delivery ``delivery_id``; its status after, or None when that
    attempt was already made, or the delivery ended (sent, failed) or is gone."""
    delivery = _claim(delivery_id, attempt)
    if delivery is None:
        return None
    channel = delivery.channel
    kind, target, secret = (channel.kind, channel.target, channel.secret) if channel else ("email", delivery.email, "")
    try:
        status = channels.send(
            kind=kind,
            target=target,
            secret=secret,
            payload=delivery.payload,
            idempotency_id=str(delivery.idempotency_id),
        )
    except UrlRefused as exc:
        _record_failure(delivery, f"rule {_rule_name(delivery)!r}: webhook URL refused: {exc}", final=True)
        return DeliveryStatus.FAILED
    except channels.DeliveryFailed as exc:
        logger.warning("alert delivery %s attempt %s failed: %s", delivery.pk, attempt, exc)
        _record_failure(delivery, str(exc), final=False)
        return Delivery.objects.get(pk=delivery.pk).status
    Delivery.objects.filter(pk=delivery.pk).update(
        status=DeliveryStatus.SENT, delivered_at=timezone.now(), response_status=status, error=""
    )
    _channel_outcome(channel, "sent")
    return DeliveryStatus.SENT


def deliveries_retry_due(*, now=None) -> int:
    """Queue the next attempt of every delivery whose backoff has passed (beat); how many were queued.

    The row's ``next_attempt_at`` is cleared by the same conditional UPDATE that
    picks it, so two beats queue an attempt once.
    """
    now = now or timezone.now()
    queued = 0
    due = Delivery.objects.filter(status=DeliveryStatus.RETRYING, next_attempt_at__lte=now)
    for delivery_id in due.values_list("pk", flat=True)[:500]:
        with transaction.atomic():
            if Delivery.objects.filter(pk=delivery_id, next_attempt_at__lte=now).update(next_attempt_at=None):
                delivery_queue(delivery=Delivery.objects.get(pk=delivery_id))
                queued += 1
    return queued
