"""Alerts reach real receivers run by the test: an SMTP server, a signed webhook across an outage, chat shapes
(docs/design/alerts.md#channels, #delivery)."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from alerts.models import Channel, Delivery, DeliveryStatus, Event
from alerts.services.delivery import deliveries_retry_due
from alerts.services.rules import channel_create, rule_create
from runs.liveness import runs_reap_crashed
from runs.models import Run, RunStatus
from runs.resume import run_start
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db(transaction=True)


def running_run(project, creator, name: str, *, beat_ago_s: int = 3600):
    """A running Run whose heartbeats stopped ``beat_ago_s`` seconds ago."""
    return RunFactory(
        project=project,
        created_by=creator,
        name=name,
        status=RunStatus.RUNNING,
        heartbeat_at=timezone.now() - timedelta(seconds=beat_ago_s),
    )


def crash_rule(admin, project, channel: Channel):
    return rule_create(
        actor=admin, project=project, name="crashes", event=Event.CRASHED, personal=False, channel_ids=[channel.pk]
    )


def test_the_smtp_server_gets_the_email_of_a_run_the_reaper_marked_crashed(eager, smtp, project, admin, creator):
    channel, secret = channel_create(
        actor=admin, project=project, name="oncall", kind="email", target="ops@example.org"
    )
    crash_rule(admin, project, channel)
    running_run(project, creator, "llama-pretrain")

    assert runs_reap_crashed() == 1

    [(recipients, text)] = smtp.messages
    assert recipients == ["ops@example.org"]
    assert "Subject: [mado] Run llama-pretrain crashed" in text
    assert "no heartbeat since" in text
    assert secret == ""  # only a webhook has a secret
    assert Delivery.objects.get().status == DeliveryStatus.SENT


def test_a_personal_subscription_mails_the_member_who_made_it(eager, smtp, project, member, creator):
    member.email = "mike@example.org"
    member.save()
    rule_create(actor=member, project=project, name="mine", event=Event.CRASHED, personal=True)
    running_run(project, creator, "nightly")

    runs_reap_crashed()

    assert [recipients for recipients, _ in smtp.messages] == [["mike@example.org"]]


@pytest.mark.parametrize(
    ("outage_s", "first_wait_s"), [(2.0, 0.2), pytest.param(60.0, 1, marks=pytest.mark.slow, id="60s")]
)
def test_the_webhook_gets_every_event_once_signed_across_a_receiver_outage(
    eager, settings, webhook, project, admin, creator, outage_s, first_wait_s
):
    settings.MADO_ALERT_RETRY_SECONDS = first_wait_s
    channel, secret = channel_create(actor=admin, project=project, name="hook", kind="webhook", target=webhook.url)
    webhook.secret = secret
    crash_rule(admin, project, channel)
    runs = [running_run(project, creator, f"run-{n}") for n in range(3)]

    webhook.stop()  # the receiver is down when the reaper marks the Runs crashed
    assert runs_reap_crashed() == 3
    outage_started = time.monotonic()
    assert webhook.received == []
    while time.monotonic() - outage_started < outage_s:  # beat keeps trying while the receiver is down
        deliveries_retry_due()
        time.sleep(0.1)
    log = list(Delivery.objects.order_by("pk"))
    assert all(d.status == DeliveryStatus.RETRYING and d.attempts >= 2 for d in log)
    assert all("ConnectionError" in d.error for d in log)
    assert Channel.objects.get().is_failing  # shown on the Project page

    webhook.start()
    deadline = time.monotonic() + 30 + outage_s
    while Delivery.objects.exclude(status=DeliveryStatus.SENT).exists() and time.monotonic() < deadline:
        deliveries_retry_due()
        time.sleep(0.1)
    for _ in range(5):  # later beats send nothing again
        deliveries_retry_due()

    ids = [r["headers"]["X-Mado-Delivery"] for r in webhook.received]
    assert sorted(ids) == sorted(str(d.idempotency_id) for d in log)  # every event, exactly once
    assert all(r["signed"] for r in webhook.received)
    bodies = sorted(webhook.received, key=lambda r: r["body"]["run"]["id"])
    assert [b["body"]["run"]["id"] for b in bodies] == [run.pk for run in runs]
    assert {b["body"]["schema"] for b in bodies} == {"mado.alert/v1"}
    assert {b["body"]["event"] for b in bodies} == {"crashed"}
    sent = list(Delivery.objects.order_by("pk"))
    assert all(d.status == DeliveryStatus.SENT and d.attempts >= 3 and d.response_status == 204 for d in sent)
    assert not Channel.objects.get().is_failing


def test_a_tampered_or_old_signature_is_refused_by_the_receiver_check():
    from alerts.channels import sign
    from tests.alerts.receivers import signature_ok

    body = b'{"a":1}'
    header = sign("s3cret", int(time.time()), body)
    assert signature_ok("s3cret", header, body)
    assert not signature_ok("s3cret", header, b'{"a":2}')
    assert not signature_ok("other", header, body)
    assert not signature_ok("s3cret", sign("s3cret", int(time.time()) - 3600, body), body)


@pytest.mark.parametrize(
    ("kind", "check"),
    [
        ("slack", lambda body: "Run chat-run crashed" in body["text"]),
        ("discord", lambda body: "Run chat-run crashed" in body["content"]),
        ("teams", lambda body: body["@type"] == "MessageCard" and body["title"] == "Run chat-run crashed"),
    ],
)
def test_a_chat_webhook_gets_the_chat_shaped_body(eager, webhook, project, admin, creator, kind, check):
    channel, _ = channel_create(actor=admin, project=project, name=kind, kind=kind, target=webhook.url)
    crash_rule(admin, project, channel)
    running_run(project, creator, "chat-run")

    runs_reap_crashed()

    [received] = webhook.received
    assert check(received["body"]), received["body"]
    assert "X-Mado-Signature" not in received["headers"]


def test_send_test_reaches_the_channel_and_is_in_its_log(eager, webhook, project, admin, api):
    channel, secret = channel_create(actor=admin, project=project, name="hook", kind="webhook", target=webhook.url)
    webhook.secret = secret

    answer = api(admin).post(f"/api/v1/alert-channels/{channel.pk}/test/")

    assert answer.status_code == 202
    [received] = webhook.received
    assert received["signed"] and received["body"]["event"] == "test"
    log = api(admin).get(f"/api/v1/alert-channels/{channel.pk}/deliveries/").json()["results"]
    assert [(d["status"], d["attempts"], d["response_status"]) for d in log] == [("sent", 1, 204)]


def test_a_channel_that_keeps_failing_ends_failed_with_its_error(eager, settings, webhook, project, admin, creator):
    settings.MADO_ALERT_MAX_ATTEMPTS = 2
    channel, _ = channel_create(actor=admin, project=project, name="hook", kind="webhook", target=webhook.url)
    crash_rule(admin, project, channel)
    webhook.stop()
    running_run(project, creator, "doomed")

    runs_reap_crashed()
    time.sleep(0.3)
    deliveries_retry_due()

    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.FAILED, 2)
    channel.refresh_from_db()
    assert channel.is_failing and "ConnectionError" in channel.last_error


def test_a_run_that_crashes_again_after_a_resume_by_id_alerts_again(eager, smtp, webhook, project, admin, creator):
    hook, secret = channel_create(actor=admin, project=project, name="hook", kind="webhook", target=webhook.url)
    webhook.secret = secret
    mail, _ = channel_create(actor=admin, project=project, name="oncall", kind="email", target="ops@example.org")
    rule_create(
        actor=admin,
        project=project,
        name="crashes",
        event=Event.CRASHED,
        personal=False,
        channel_ids=[hook.pk, mail.pk],
    )
    run = running_run(project, creator, "twice")

    assert runs_reap_crashed() == 1  # the first crash
    run_start(actor=creator, project=project, external_id=run.external_id, resume="allow")  # same-run resume
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert runs_reap_crashed() == 1  # the second crash of the same Run

    assert [text.count("Subject: [mado] Run twice crashed") for _, text in smtp.messages] == [1, 1]
    bodies = [r["body"] for r in webhook.received]
    assert [(b["event"], b["run"]["id"], b["condition"]) for b in bodies] == [
        ("crashed", run.pk, "crashed"),
        ("crashed", run.pk, "crashed after resume #1"),
    ]
    assert all(r["signed"] for r in webhook.received)
    assert Delivery.objects.filter(status=DeliveryStatus.SENT).count() == 4  # two events × two channels
