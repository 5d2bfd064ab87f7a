"""How one delivery reaches its channel: the message shapes and the signed webhook (docs/design/alerts.md#channels).

The webhook body is the delivery's versioned payload (``"schema":
"mado.alert/v1"``) as JSON; ``X-Mado-Signature: t=<unix s>,v1=<hex>`` is
HMAC-SHA256 with the channel's secret over ``"<t>." + body``, so a receiver
verifies the body and refuses an old timestamp (a replay).
``X-Mado-Delivery`` is the idempotency id, the same on every attempt.
Chat kinds get the message shape their incoming webhooks take.
"""

import hashlib
import hmac
import json
import time

import urllib3
from django.conf import settings
from django.core.mail import send_mail

from alerts.models import ChannelKind
from alerts.ssrf import post_guarded

SCHEMA = "mado.alert/v1"
TIMEOUT_S = 10


class DeliveryFailed(Exception):
    """The channel did not take the message (network error, a non-2xx answer); worth another attempt."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``X-Mado-Signature`` value for ``body`` sent at ``timestamp`` (Unix seconds) with ``secret``."""
    digest = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def _line(payload: dict) -> str:
    run = payload.get("run") or {}
    where = f" — {run.get('name') or run.get('external_id')} ({run.get('url')})" if run else ""
    return f"[{payload['level']}] {payload['title']}{where}\n{payload['text']}".strip()


def chat_body(kind: str, payload: dict) -> dict:
    """The JSON a ``kind`` (slack, teams, discord) incoming webhook takes for ``payload``."""
    if kind == ChannelKind.SLACK:
        return {"text": _line(payload)}
    if kind == ChannelKind.DISCORD:
        return {"content": _line(payload)[:2000]}
    return {
        "@type": "MessageCard",
        "@context": "https://schema.org/extensions",
        "summary": payload["title"],
        "title": payload["title"],
        "text": _line(payload),
    }


def _post(url: str, body: bytes, headers: dict) -> int:
    try:
        response = post_guarded(
            url, data=body, headers={"Content-Type": "application/json", **headers}, timeout=TIMEOUT_S
        )
    except (OSError, urllib3.exceptions.HTTPError) as exc:  # connection refused, timeout, TLS
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}") from exc
    if not 200 <= response.status_code < 300:
        raise DeliveryFailed(f"HTTP {response.status_code}: {response.text[:300]}")
    return response.status_code


def send(*, kind: str, target: str, secret: str, payload: dict, idempotency_id: str) -> int | None:
    """Send ``payload`` through a channel of ``kind`` at ``target``; the HTTP status (None for email).

    Raises ``DeliveryFailed`` (retry) or ``alerts.ssrf.UrlRefused`` (never retried).
    """
    if kind == ChannelKind.EMAIL:
        recipients = [address.strip() for address in target.split(",") if address.strip()]
        try:
            send_mail(f"[mado] {payload['title']}", _line(payload), settings.DEFAULT_FROM_EMAIL, recipients)
        except OSError as exc:  # smtplib's errors are OSErrors
            raise DeliveryFailed(f"{type(exc).__name__}: {exc}") from exc
        return None
    if kind == ChannelKind.WEBHOOK:
        body = json.dumps(payload, separators=(",", ":")).encode()
        signature = sign(secret, int(time.time()), body)
        return _post(target, body, {"X-Mado-Signature": signature, "X-Mado-Delivery": idempotency_id})
    body = json.dumps(chat_body(kind, payload)).encode()
    return _post(target, body, {})
