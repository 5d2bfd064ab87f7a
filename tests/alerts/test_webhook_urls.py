"""A webhook URL that is not a well-formed http(s) URL is a 400 naming ``target`` when the channel is saved (API and
page), and a stored one ends its delivery failed with the reason; hostile URLs never answer 500
(docs/design/alerts.md#ssrf)."""

import socket

import pytest

from alerts.models import Channel, Delivery, DeliveryStatus
from alerts.services.rules import channel_create, channel_test

pytestmark = pytest.mark.django_db

MALFORMED = [
    ("http://[::1/hook", "is not a valid URL (Invalid IPv6 URL)"),
    ("http://[v1.abc]/hook", "malformed IPv6 address in brackets"),
    ("http://[fe80::1%25eth0]/hook", "malformed IPv6 address in brackets"),
    ("http://]@[::1/hook", "malformed IPv6 address in brackets"),
    ("http://hooks.example.org:99999/hook", "bad port"),
    ("http://hooks.example.org:8o/hook", "bad port"),
    ("http://hooks.example.org:0/hook", "bad port"),
    ("http://[::1]:80:81/hook", "bad port"),
    ("http:///hook", "not an http or https URL with a host"),
    ("https://user@/hook", "not an http or https URL with a host"),
    ("http://a[::1]/hook", "not an http or https URL with a host"),
    ("ftp://hooks.example.org/hook", "not an http or https URL with a host"),
    ("javascript:alert(1)", "not an http or https URL with a host"),
    ("hooks.example.org/hook", "not an http or https URL with a host"),
]
HOSTILE = [
    ("http://127.0.0.1/hook\r\nX-Injected: 1", "a space or a control character"),
    ("http://127.0.0.1\r\n/hook", "a space or a control character"),
    ("http://" + "a" * 1980 + ".org/", "no valid host name"),
    ("http://b\u00fccher.invalid/hook", "does not resolve"),
    ("http://127\u30020\u30020\u30021/hook", "resolves to 127.0.0.1"),  # ideographic full stops
    ("http://%31%32%37.0.0.1/hook", "not an http or https URL with a host"),
    ("http://hooks.example.org/caf\u00e9", "must be percent-encoded"),
    ("http://127.0.0.1:80@10.0.0.1/hook", "resolves to 10.0.0.1"),
]


def channels_url(project) -> str:
    return f"/api/v1/projects/{project.slug}/alert-channels/"


@pytest.mark.parametrize("url, reason", MALFORMED + HOSTILE)
def test_saving_a_malformed_or_hostile_url_answers_400_naming_the_field_and_stores_nothing(
    api, project, admin, url, reason
):
    answer = api(admin).post(channels_url(project), {"name": "bad", "kind": "webhook", "target": url}, format="json")

    assert answer.status_code == 400 and answer.json()["field"] == "target"
    assert reason in answer.json()["detail"]
    assert not Channel.objects.exists()


@pytest.mark.parametrize("url", ["https://hooks.example.org/" + "x" * 5000, "http://127.0.0.1\x00.example.org/"])
def test_a_url_longer_than_the_field_or_with_a_null_character_answers_400(api, project, admin, url):
    answer = api(admin).post(channels_url(project), {"name": "bad", "kind": "slack", "target": url}, format="json")

    assert answer.status_code == 400 and answer.json()["field"] == "target"


@pytest.mark.parametrize("url, reason", [MALFORMED[0], MALFORMED[4], MALFORMED[8], HOSTILE[0]])
def test_the_page_refuses_a_malformed_url_on_its_field(login, admin, project, url, reason):
    answer = login(admin).post(
        f"/projects/{project.slug}/alerts/channels/", {"name": "bad", "kind": "webhook", "target": url}
    )

    assert answer.status_code == 400 and reason in " ".join(answer.context["channel_form"].errors["target"])
    assert not Channel.objects.exists()


@pytest.mark.parametrize("url, reason", [*MALFORMED, *HOSTILE, ("http://127.0.0.1\x00.org/", "control character")])
def test_a_stored_malformed_url_ends_its_delivery_failed_with_the_reason(
    eager, django_capture_on_commit_callbacks, project, admin, url, reason
):
    """A URL stored before these rules, or written around them."""
    channel = Channel.objects.create(
        project=project, name="old", kind="webhook", target=url, secret="s", created_by=admin
    )

    with django_capture_on_commit_callbacks(execute=True):
        channel_test(actor=admin, channel=channel)

    delivery = Delivery.objects.get()
    assert delivery.status == DeliveryStatus.FAILED and delivery.attempts == 1
    assert delivery.error.startswith("rule 'send test': webhook URL refused: ") and reason in delivery.error


def test_userinfo_is_not_sent_and_a_unicode_host_is_sent_as_idna(
    eager, django_capture_on_commit_callbacks, monkeypatch, webhook, project, admin
):
    real = socket.getaddrinfo

    def resolve(host, port, *args, **kwargs):
        return real("127.0.0.1" if host == "xn--bcher-kva.test" else host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    url = f"http://user:pa%40ss@b\u00fccher.test:{webhook.port}/hook"
    channel, webhook.secret = channel_create(actor=admin, project=project, name="hook", kind="webhook", target=url)

    with django_capture_on_commit_callbacks(execute=True):
        channel_test(actor=admin, channel=channel)

    [received] = webhook.received
    assert received["signed"] and received["headers"]["Host"] == f"xn--bcher-kva.test:{webhook.port}"
    assert "Authorization" not in received["headers"]
    assert Delivery.objects.get().status == DeliveryStatus.SENT
