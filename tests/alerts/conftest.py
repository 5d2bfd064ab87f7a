"""Fixtures of the alerts tests: deliveries run in the test's process (Celery eager), real receivers."""

import pytest
from celery import current_app

from mado.env import network_port
from tests.alerts.receivers import SmtpReceiver, WebhookReceiver


@pytest.fixture
def eager(monkeypatch, settings):
    """Outbox messages run their task at once, in this process, after the commit that queued them."""
    monkeypatch.setitem(current_app.conf, "task_always_eager", True)
    settings.MADO_ALERT_RETRY_SECONDS = 0.2


@pytest.fixture
def webhook(settings):
    """A running webhook receiver on 127.0.0.1, reachable because the operator allowed 127.0.0.0/8."""
    settings.MADO_ALERT_WEBHOOK_ALLOW = (network_port("127.0.0.0/8"),)
    receiver = WebhookReceiver()
    receiver.start()
    yield receiver
    receiver.stop()


@pytest.fixture
def smtp(settings):
    """A running SMTP server; Django's SMTP backend sends to it."""
    with SmtpReceiver() as receiver:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", receiver.port
        yield receiver
