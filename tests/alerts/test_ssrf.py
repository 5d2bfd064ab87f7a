"""Webhook URLs cannot be pointed inward: refused at creation and at delivery, through redirects too
(docs/design/alerts.md#ssrf)."""

import socket

import pytest

from alerts.models import Delivery, DeliveryStatus, Event
from alerts.services.rules import channel_create, rule_create
from alerts.ssrf import UrlRefused, check_url
from runs.liveness import runs_reap_crashed
from tests.alerts.test_channels import running_run

INWARD = [
    "http://127.0.0.1:8080/hook",
    "http://[::1]/hook",
    "http://10.1.2.3/hook",
    "http://10.255.255.254:9000/x",
    "http://169.254.169.254/latest/meta-data/",
    "http://localhost:8000/hook",  # a name that resolves to loopback
    "http://[::ffff:127.0.0.1]/hook",
    "http://192.168.1.10/hook",
    "http://0.0.0.0/hook",
]


@pytest.mark.parametrize("url", INWARD)
def test_an_inward_url_is_refused_with_the_reason(url):
    with pytest.raises(UrlRefused, match="loopback, private, link-local or metadata"):
        check_url(url)


def test_a_public_address_passes_and_other_schemes_do_not():
    check_url("https://93.184.215.14/hook")
    with pytest.raises(UrlRefused, match="not an http or https URL"):
        check_url("file:///etc/passwd")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:9/x", "http://[::1]/x", "http://10.0.0.5/x", "http://169.254.169.254/"]
)
def test_creating_a_webhook_to_an_inward_url_answers_400_naming_the_channel(api, project, admin, url):
    answer = api(admin).post(
        f"/api/v1/projects/{project.slug}/alert-channels/",
        {"name": "bad", "kind": "webhook", "target": url},
        format="json",
    )

    assert answer.status_code == 400
    assert answer.json()["field"] == "target"
    assert "channel 'bad'" in answer.json()["detail"] and "metadata address" in answer.json()["detail"]


@pytest.mark.django_db(transaction=True)
def test_a_delivery_to_a_url_that_now_reaches_inward_is_refused_naming_the_rule(
    eager, settings, webhook, project, admin, creator
):
    channel, _ = channel_create(actor=admin, project=project, name="hook", kind="webhook", target=webhook.url)
    rule_create(
        actor=admin,
        project=project,
        name="night crashes",
        event=Event.CRASHED,
        personal=False,
        channel_ids=[channel.pk],
    )
    settings.MADO_ALERT_WEBHOOK_ALLOW = []  # the operator closed the range (or the name now resolves inward)
    running_run(project, creator, "r")

    runs_reap_crashed()

    delivery = Delivery.objects.get()
    assert delivery.status == DeliveryStatus.FAILED and delivery.attempts == 1  # refused, never retried
    assert delivery.error.startswith("rule 'night crashes': webhook URL refused: 127.0.0.1 resolves to 127.0.0.1")
    assert webhook.received == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("inward", ["http://169.254.169.254/latest/", "http://10.0.0.1/", "http://[::1]:9/"])
def test_a_redirect_to_an_inward_url_is_refused_before_it_is_followed(eager, webhook, project, admin, creator, inward):
    channel, _ = channel_create(actor=admin, project=project, name="hook", kind="webhook", target=webhook.url)
    rule_create(
        actor=admin, project=project, name="crashes", event=Event.CRASHED, personal=False, channel_ids=[channel.pk]
    )
    webhook.redirect_to = inward
    running_run(project, creator, "r")

    runs_reap_crashed()

    delivery = Delivery.objects.get()
    assert delivery.status == DeliveryStatus.FAILED
    assert "rule 'crashes': webhook URL refused" in delivery.error and "metadata address" in delivery.error


@pytest.mark.django_db(transaction=True)
def test_the_request_goes_to_the_address_that_was_checked_not_a_second_lookup(
    eager, monkeypatch, settings, webhook, project, admin, creator
):
    """DNS rebinding: the name answers an allowed address to the check and another one after; mado connects to
    the checked one (the receiver listens on 127.0.0.1 only, so a connection to 127.0.0.2 would be refused)."""
    settings.MADO_ALERT_WEBHOOK_ALLOW = ["127.0.0.1/32"]
    real = socket.getaddrinfo
    answers = iter(["127.0.0.1", "127.0.0.1"])  # the channel's check, the delivery's check; then rebound

    def rebinding(host, port, *args, **kwargs):
        if host != "hooks.rebind.test":
            return real(host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers, "127.0.0.2"), port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    url = f"http://hooks.rebind.test:{webhook.port}/hook"
    channel, secret = channel_create(actor=admin, project=project, name="hook", kind="webhook", target=url)
    webhook.secret = secret
    rule_create(
        actor=admin, project=project, name="crashes", event=Event.CRASHED, personal=False, channel_ids=[channel.pk]
    )
    running_run(project, creator, "r")

    runs_reap_crashed()

    [received] = webhook.received
    assert received["signed"] and received["headers"]["Host"] == f"hooks.rebind.test:{webhook.port}"
    assert Delivery.objects.get().status == DeliveryStatus.SENT
