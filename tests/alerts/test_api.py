"""Who manages what: admins the Project's rules and channels, members their own subscriptions, viewers nothing
(docs/design/alerts.md#who); bad input names the field."""

import pytest

from alerts.models import Rule
from mado.env import network_port

pytestmark = pytest.mark.django_db

SUBSCRIPTION = {"name": "my crashes", "event": "crashed", "personal": True}


def rules_url(project):
    return f"/api/v1/projects/{project.slug}/alert-rules/"


def test_a_member_subscribes_and_sees_the_projects_rules_and_only_their_own_subscriptions(
    api, project, member, creator, admin
):
    assert (
        api(admin).post(rules_url(project), {"name": "all crashes", "event": "crashed"}, format="json").status_code
        == 201
    )
    assert api(member).post(rules_url(project), SUBSCRIPTION, format="json").status_code == 201
    assert api(creator).post(rules_url(project), {**SUBSCRIPTION, "name": "carol's"}, format="json").status_code == 201

    listed = api(member).get(rules_url(project)).json()["results"]

    assert [(r["name"], r["personal"]) for r in listed] == [("all crashes", False), ("my crashes", True)]


def test_a_viewer_cannot_subscribe(api, project, viewer):
    answer = api(viewer).post(rules_url(project), SUBSCRIPTION, format="json")
    assert answer.status_code == 403 and "viewer" in answer.json()["detail"]


def test_a_subscription_is_deleted_by_its_owner_or_an_admin_and_hidden_from_other_members(
    api, project, member, creator, admin
):
    mine = api(member).post(rules_url(project), SUBSCRIPTION, format="json").json()["id"]
    other = api(member).post(rules_url(project), {**SUBSCRIPTION, "name": "second"}, format="json").json()["id"]

    assert api(creator).delete(f"/api/v1/alert-rules/{mine}/").status_code == 404
    assert api(member).delete(f"/api/v1/alert-rules/{mine}/").status_code == 204
    assert api(admin).delete(f"/api/v1/alert-rules/{other}/").status_code == 204
    assert not Rule.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "event": "metric_above", "key": "loss"}, "threshold"),
        ({"name": "x", "event": "metric_nonfinite"}, "key"),
        ({"name": "x", "event": "metric_stalled", "key": "loss"}, "stalled_minutes"),
        ({"name": "x", "event": "exploded"}, "event"),
        ({"name": "x", "event": "crashed", "channel_ids": [999]}, "channel_ids"),
    ],
)
def test_a_bad_rule_answers_400_naming_the_field_and_stores_nothing(api, project, admin, body, field):
    answer = api(admin).post(rules_url(project), body, format="json")
    assert answer.status_code == 400 and answer.json()["field"] == field
    assert not Rule.objects.exists()


def test_the_webhook_secret_is_shown_once(api, project, admin, settings):
    settings.MADO_ALERT_WEBHOOK_ALLOW = (network_port("127.0.0.0/8"),)
    url = f"/api/v1/projects/{project.slug}/alert-channels/"
    created = api(admin).post(url, {"name": "hook", "kind": "webhook", "target": "http://127.0.0.1:9/h"}, format="json")

    assert created.status_code == 201 and len(created.json()["secret"]) >= 40
    assert "secret" not in api(admin).get(url).json()["results"][0]
    again = api(admin).post(url, {"name": "hook", "kind": "webhook", "target": "http://127.0.0.1:9/h"}, format="json")
    assert again.status_code == 409 and again.json()["field"] == "name"


def test_a_worker_knows_the_delivery_task_and_beat_schedules_the_retries_and_the_stalled_check():
    from config.celery import app
    from mado.periodic import beat_schedule

    app.loader.import_default_modules()

    assert {"alerts.tasks.deliver", "alerts.tasks.retry_deliveries", "alerts.tasks.check_stalled_metrics"} <= set(
        app.tasks
    )
    assert {"alerts-retry-deliveries", "alerts-stalled-metrics"} <= set(beat_schedule())


def test_a_chat_channels_url_is_shown_whole_to_admins_only(api, client, project, admin, member, settings):
    settings.MADO_ALERT_WEBHOOK_ALLOW = (network_port("127.0.0.0/8"),)
    url = f"/api/v1/projects/{project.slug}/alert-channels/"
    secret_url = "http://127.0.0.1:9/services/T000/B000/XXXXsecretXXXX"
    created = api(admin).post(url, {"name": "chat", "kind": "slack", "target": secret_url}, format="json")
    assert created.status_code == 201 and created.json()["target"] == secret_url
    api(admin).post(url, {"name": "mail", "kind": "email", "target": "ops@example.org"}, format="json")
    by_admin = {c["name"]: c["target"] for c in api(admin).get(url).json()["results"]}
    by_member = {c["name"]: c["target"] for c in api(member).get(url).json()["results"]}
    assert by_admin == {"chat": secret_url, "mail": "ops@example.org"}
    assert by_member == {"chat": "http://127.0.0.1/…", "mail": "ops@example.org"}
    client.force_login(member)
    page = client.get(f"/projects/{project.slug}/alerts/").content.decode()
    assert "XXXXsecretXXXX" not in page and "http://127.0.0.1/…" in page
