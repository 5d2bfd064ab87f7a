"""``run.alert`` and ``mado alert`` go through the Project's alert rules and channels, rate-limited per Run
(docs/design/alerts.md#run-alert)."""

import pytest
from click.testing import CliRunner

import mado_tracking
from alerts.models import Event, Firing
from alerts.services.rules import channel_create, rule_create
from mado_tracking.cli import main
from tests.alerts.conftest import eager, webhook  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listening(eager, webhook, project, admin):  # noqa: F811
    channel, secret = channel_create(actor=admin, project=project, name="hook", kind="slack", target=webhook.url)
    rule_create(
        actor=admin, project=project, name="from code", event=Event.RUN_ALERT, personal=False, channel_ids=[channel.pk]
    )
    return webhook


def test_run_alert_reaches_the_channel_and_the_rate_limit_stops_a_storm(mmt_env, settings, listening):
    settings.MADO_ALERT_RUN_RATE = 2
    with mado_tracking.start_run(name="talker") as run:
        assert run.alert("loss plateaued", "no progress for 1,000 steps", level="warn") == 1
        assert run.alert("lr dropped", level="info") == 1
        assert run.alert("third in a minute") is None  # refused (429), training goes on

    texts = [received["body"]["text"] for received in listening.received]
    assert len(texts) == 2
    assert texts[0].startswith("[warn] loss plateaued — talker") and "no progress for 1,000 steps" in texts[0]
    assert Firing.objects.count() == 2


def test_run_alert_refuses_a_bad_level_before_sending(mmt_env):
    with mado_tracking.start_run() as run, pytest.raises(ValueError, match="level"):
        run.alert("x", level="panic")


def test_mado_alert_sends_from_the_command_line(mmt_env, listening, project, member):
    with mado_tracking.start_run(name="shell") as run:
        result = CliRunner().invoke(main, ["alert", str(run.id), "disk almost full", "--level", "error"])

    assert result.exit_code == 0, result.output
    assert result.output.strip() == "sent through 1 rule(s)"
    assert listening.received[0]["body"]["text"].startswith("[error] disk almost full")


def test_a_viewer_cannot_send_a_run_alert(api, project, run, viewer):
    answer = api(viewer).post(f"/api/v1/runs/{run.pk}/alerts/", {"title": "x"}, format="json")
    assert answer.status_code == 403
