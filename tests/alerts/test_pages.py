"""The alerts page's forms (docs/design/alerts.md#rules): admins add and delete Project rules and add channels,
members subscribe and delete their own subscriptions; what the services refuse is shown on the field it names,
and nothing is stored."""

import pytest

from alerts.models import Channel, Delivery, Event, Rule
from alerts.services.delivery import delivery_give_up
from alerts.services.rules import channel_create, rule_create
from mado.models import AuditEvent

pytestmark = pytest.mark.django_db


def alerts_url(project, tail: str = "") -> str:
    return f"/projects/{project.slug}/alerts/{tail}"


@pytest.fixture
def oncall(project, admin):
    return channel_create(actor=admin, project=project, name="oncall", kind="email", target="ops@example.org")[0]


def test_an_admin_adds_a_metric_rule_sent_to_a_channel(login, admin, project, oncall):
    client = login(admin)
    form = {
        "name": "loss blew up",
        "event": Event.METRIC_ABOVE,
        "key": "train/loss",
        "threshold": "10",
        "consecutive": "3",
        "tags": "team=vision, nightly",
        "channels": [oncall.pk],
    }
    answer = client.post(alerts_url(project, "rules/"), form, follow=True)
    assert answer.status_code == 200 and "Rule loss blew up added." in answer.content.decode()
    rule = Rule.objects.get(name="loss blew up")
    assert (rule.event, rule.key, rule.threshold, rule.consecutive) == ("metric_above", "train/loss", 10.0, 3)
    assert rule.tags == ["team=vision", "nightly"] and rule.kinds == [] and rule.owner is None
    assert list(rule.channels.all()) == [oncall]
    assert 'data-rule="loss blew up"' in answer.content.decode()
    assert AuditEvent.objects.filter(action="alert_rule.create", actor_name=admin.username).count() == 1


@pytest.mark.parametrize(
    ("form", "field", "message"),
    [
        ({"event": "metric_above", "threshold": "1"}, "key", "a metric condition needs the metric key"),
        ({"event": "metric_below", "key": "loss"}, "threshold", "an above/below condition needs a threshold"),
        ({"event": "metric_above", "key": "loss", "threshold": "lots"}, "threshold", "Enter a number."),
        ({"event": "exploded"}, "event", "Select a valid choice."),
        ({"event": "crashed", "consecutive": "0"}, "consecutive", "greater than or equal to 1"),
    ],
)
def test_a_refused_rule_names_the_field_and_stores_nothing(login, admin, project, form, field, message):
    answer = login(admin).post(alerts_url(project, "rules/"), {"name": "r", **form})
    assert answer.status_code == 400
    assert message in " ".join(answer.context["rule_form"].errors[field])
    assert f'data-field="{field}"' in answer.content.decode() and not Rule.objects.exists()


def test_a_member_subscribes_deletes_their_subscription_and_cannot_touch_project_rules(
    login, member, admin, project, oncall
):
    project_rule = rule_create(actor=admin, project=project, name="crashes", event="crashed", personal=False)
    client = login(member)
    page = client.get(alerts_url(project)).content.decode()
    assert "Subscribe" in page and "Add a channel" not in page
    subscribed = client.post(alerts_url(project, "rules/"), {"name": "mine", "event": "failed", "personal": "on"})
    assert subscribed.status_code == 302
    mine = Rule.objects.get(name="mine")
    assert mine.owner == member and not mine.channels.exists()

    refused = client.post(alerts_url(project, "rules/"), {"name": "everyone", "event": "failed"})
    assert refused.status_code == 403 and not Rule.objects.filter(name="everyone").exists()
    assert client.post(f"/alert-rules/{project_rule.pk}/delete/").status_code == 403
    assert client.post(f"/alert-rules/{mine.pk}/delete/").status_code == 302
    assert list(Rule.objects.values_list("name", flat=True)) == ["crashes"]


def test_a_webhooks_secret_is_shown_once_and_an_inward_url_is_refused(login, admin, project, webhook):
    client = login(admin)
    created = client.post(alerts_url(project, "channels/"), {"name": "ci", "kind": "webhook", "target": webhook.url})
    channel = Channel.objects.get(name="ci")
    assert created.status_code == 200 and channel.secret and channel.secret in created.content.decode()
    assert channel.secret not in client.get(alerts_url(project)).content.decode()

    inward = client.post(
        alerts_url(project, "channels/"),
        {"name": "sneaky", "kind": "webhook", "target": "http://169.254.169.254/latest/"},
    )
    assert inward.status_code == 400 and inward.context["channel_form"].errors["target"]
    taken = client.post(alerts_url(project, "channels/"), {"name": "ci", "kind": "email", "target": "a@example.org"})
    assert taken.status_code == 409 and "exists in this project" in taken.context["channel_form"].errors["name"][0]
    mailed = client.post(alerts_url(project, "channels/"), {"name": "team", "kind": "email", "target": "a@example.org"})
    assert mailed.status_code == 302
    assert sorted(Channel.objects.values_list("name", flat=True)) == ["ci", "team"]


def test_the_forms_are_translated_to_japanese(login, admin, project):
    client = login(admin)
    client.cookies["django_language"] = "ja"
    page = client.get(alerts_url(project), HTTP_ACCEPT_LANGUAGE="ja").content.decode()
    assert "ルールを追加" in page and "チャネルを追加" in page and "しきい値" in page


def test_an_admin_deletes_a_channel_its_rules_stop_sending_there_and_a_queued_delivery_is_dropped(
    login, api, admin, member, project, oncall
):
    rule = rule_create(
        actor=admin, project=project, name="crashes", event="crashed", personal=False, channel_ids=[oncall.pk]
    )
    queued = Delivery.objects.create(channel=oncall, payload={"title": "t"})
    assert login(member).post(f"/alert-channels/{oncall.pk}/delete/").status_code == 403
    assert api(member).delete(f"/api/v1/alert-channels/{oncall.pk}/").status_code == 403
    client = login(admin)
    assert "Delete channel oncall and its deliveries" in client.get(alerts_url(project)).content.decode()
    done = client.post(f"/alert-channels/{oncall.pk}/delete/", follow=True)
    assert "Channel oncall deleted." in done.content.decode() and not Channel.objects.exists()
    assert list(Rule.objects.get(pk=rule.pk).channels.all()) == [] and not Delivery.objects.filter(pk=queued.pk)
    delivery_give_up([queued.pk, 1], "no worker took it")  # its outbox message, later: nothing to record
    assert api(admin).delete(f"/api/v1/alert-channels/{oncall.pk}/").status_code == 404
    assert AuditEvent.objects.filter(action="alert_channel.delete", actor_name=admin.username).count() == 1
