"""Webhook URLs cannot be pointed inward: refused at creation and at delivery, through redirects too; the
operator's allow-list opens an address or range on every port or on one (docs/design/alerts.md#ssrf)."""

import socket

import pytest

from alerts.models import Delivery, DeliveryStatus, Event
from alerts.services.rules import channel_create, channel_test, rule_create
from alerts.ssrf import UrlRefused, check_url, post_guarded
from mado.env import network_port
from runs.liveness import runs_reap_crashed
from tests.alerts.receivers import WebhookReceiver
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
    settings.MADO_ALERT_WEBHOOK_ALLOW = (network_port("127.0.0.1/32"),)
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


# One address of every range of IANA's IPv4 and IPv6 special-purpose registries that is not globally reachable,
# multicast, and the ranges that lead into another network: 6to4, Teredo, NAT64, site-local.
SPECIAL = [
    "0.0.0.1",
    "10.1.2.3",
    "100.64.0.1",
    "127.0.0.1",
    "169.254.169.254",
    "172.16.0.1",
    "192.0.0.8",
    "192.0.0.170",
    "192.0.2.1",
    "192.88.99.1",
    "192.168.1.10",
    "198.18.0.1",
    "198.51.100.1",
    "203.0.113.1",
    "224.0.0.1",
    "240.0.0.1",
    "255.255.255.255",
    "::",
    "::1",
    "::ffff:127.0.0.1",
    "::ffff:169.254.169.254",
    "::127.0.0.1",
    "64:ff9b::808:808",
    "64:ff9b:1::1",
    "100::1",
    "100:0:0:1::1",
    "2001::1",
    "2001:2::1",
    "2001:10::1",
    "2001:db8::1",
    "2002:808:808::1",
    "2002:7f00:1::1",
    "3fff::1",
    "5f00::1",
    "fc00::1",
    "fd00:ec2::254",
    "fe80::1",
    "fec0::1",
    "ff02::1",
]


def url_of(address: str, port: int | None = None) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}{f':{port}' if port else ''}/hook"


@pytest.mark.parametrize("address", SPECIAL)
def test_every_special_purpose_address_is_refused(address):
    with pytest.raises(UrlRefused, match="another special-purpose one: webhooks may not reach"):
        check_url(url_of(address))


@pytest.mark.parametrize("address", ["93.184.215.14", "::ffff:93.184.215.14", "2606:4700:4700::1111"])
def test_a_globally_reachable_address_passes_an_ipv4_mapped_one_judged_by_its_ipv4(address):
    assert check_url(url_of(address)).port == 80


@pytest.mark.parametrize(
    "entry, address",
    [
        ("2002::/16", "2002:808:808::1"),
        ("[fec0::/10]:80", "fec0::1"),
        ("127.0.0.0/8", "::ffff:127.0.0.1"),
        ("64:ff9b::/96", "64:ff9b::a00:1"),
        ("2001::/32", "2001::1"),
    ],
)
def test_a_special_address_the_operator_allowed_passes(settings, entry, address):
    settings.MADO_ALERT_WEBHOOK_ALLOW = (network_port(entry),)
    assert check_url(url_of(address)).address


@pytest.mark.parametrize(
    "entry, address",
    [
        ("127.0.0.1:8443", "127.0.0.1"),
        ("127.0.0.0/8:8443", "127.0.0.5"),
        ("[::1]:8443", "::1"),
        ("[::/120]:8443", "::1"),
    ],
)
def test_an_allowed_entry_with_a_port_opens_exactly_that_port(settings, entry, address):
    settings.MADO_ALERT_WEBHOOK_ALLOW = (network_port(entry),)

    assert check_url(url_of(address, 8443)).port == 8443
    for port in (8442, 8444, None):
        with pytest.raises(UrlRefused, match="reachable on other ports only, not on"):
            check_url(url_of(address, port))
    with pytest.raises(UrlRefused, match="webhooks may not reach"):
        check_url(url_of("10.0.0.1", 8443))


@pytest.fixture
def second_webhook():
    receiver = WebhookReceiver()
    receiver.start()
    yield receiver
    receiver.stop()


@pytest.mark.django_db(transaction=True)
def test_a_redirect_to_a_port_the_operator_did_not_open_is_not_followed(
    eager, settings, webhook, second_webhook, project, admin
):
    settings.MADO_ALERT_WEBHOOK_ALLOW = (network_port(f"127.0.0.1:{webhook.port}"),)
    channel, _ = channel_create(actor=admin, project=project, name="hook", kind="webhook", target=webhook.url)
    webhook.redirect_to = second_webhook.url

    channel_test(actor=admin, channel=channel)

    delivery = Delivery.objects.get()
    assert delivery.status == DeliveryStatus.FAILED and delivery.attempts == 1
    assert f"webhook URL refused: the redirect to '{second_webhook.url}' is refused" in delivery.error
    assert f"reachable on other ports only, not on {second_webhook.port}" in delivery.error
    assert second_webhook.received == []


@pytest.mark.django_db(transaction=True)
def test_three_redirects_are_followed_to_the_allowed_port(eager, settings, webhook, project, admin):
    settings.MADO_ALERT_WEBHOOK_ALLOW = (network_port(f"127.0.0.1:{webhook.port}"),)
    channel, secret = channel_create(
        actor=admin, project=project, name="hook", kind="webhook", target=webhook.hops_url(3)
    )
    webhook.secret = secret

    channel_test(actor=admin, channel=channel)

    [received] = webhook.received
    assert received["signed"] and Delivery.objects.get().status == DeliveryStatus.SENT


@pytest.mark.django_db(transaction=True)
def test_a_fourth_redirect_fails_the_delivery(eager, webhook, project, admin):
    channel, _ = channel_create(actor=admin, project=project, name="hook", kind="webhook", target=webhook.hops_url(4))

    channel_test(actor=admin, channel=channel)

    delivery = Delivery.objects.get()
    assert delivery.status == DeliveryStatus.FAILED and delivery.attempts == 1
    assert "webhook URL refused: more than 3 redirects (the next to '/hop/0')" in delivery.error
    assert webhook.received == []


def test_a_redirect_from_https_to_http_is_refused(monkeypatch):
    class Redirect:
        status, data, headers = 307, b"", {"Location": "http://93.184.215.14/hook"}

    monkeypatch.setattr("alerts.ssrf._post_pinned", lambda target, **kwargs: Redirect)
    with pytest.raises(UrlRefused, match="it leaves https for http"):
        post_guarded("https://93.184.215.14/hook", data=b"{}", headers={}, timeout=1)
