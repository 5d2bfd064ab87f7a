"""Metric conditions fire as points arrive, once per Run and condition; a stalled loop is noticed
(docs/design/alerts.md#metric-rules)."""

from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from alerts.evaluate import longest_run, stalled_runs_check
from alerts.models import Delivery, Event, Firing
from alerts.services.rules import channel_create, rule_create
from runs.models import RunStatus
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db(transaction=True)


def post(api, user, run, points):
    answer = api(user).post(f"/api/v1/runs/{run.pk}/metrics/", {"points": points}, format="json")
    assert answer.status_code == 201, answer.content
    return answer


def loss(steps, value=lambda step: 1.0 / (step + 1)):
    return [{"key": "train.loss", "value": value(step), "step": step} for step in steps]


@pytest.fixture
def hook(eager, webhook, project, admin):
    channel, secret = channel_create(actor=admin, project=project, name="hook", kind="webhook", target=webhook.url)
    webhook.secret = secret
    return channel


def test_a_nan_loss_fires_within_the_batch_that_carries_it_and_once_only(api, hook, webhook, project, admin, creator):
    rule_create(
        actor=admin,
        project=project,
        name="nan",
        event=Event.METRIC_NONFINITE,
        personal=False,
        key="train.loss",
        channel_ids=[hook.pk],
    )
    run = RunFactory(project=project, created_by=creator, name="diverging")
    post(api, creator, run, loss(range(100)))
    assert webhook.received == []

    post(api, creator, run, loss(range(100, 200), lambda step: "NaN" if step >= 150 else 0.5))

    [received] = webhook.received
    assert received["body"]["title"] == "train.loss is nan at step 150"
    assert received["body"]["level"] == "error"
    post(api, creator, run, loss(range(200, 300), lambda step: "Infinity"))
    post(api, creator, run, loss(range(300, 310), lambda step: "NaN"))
    assert len(webhook.received) == 1 and Firing.objects.count() == 1 and Delivery.objects.count() == 1


def test_a_rule_on_another_key_or_of_a_filtered_out_kind_stays_quiet(api, hook, webhook, project, admin, creator):
    rule_create(
        actor=admin,
        project=project,
        name="acc",
        event=Event.METRIC_NONFINITE,
        personal=False,
        key="val.acc",
        channel_ids=[hook.pk],
    )
    rule_create(
        actor=admin,
        project=project,
        name="eval only",
        event=Event.METRIC_NONFINITE,
        personal=False,
        key="train.loss",
        kinds=["evaluation"],
        channel_ids=[hook.pk],
    )
    run = RunFactory(project=project, created_by=creator, name="training-run")

    post(api, creator, run, loss(range(10), lambda step: "NaN"))

    assert webhook.received == [] and Firing.objects.count() == 0


def test_above_a_threshold_for_n_points_in_a_row_counts_across_batches(api, hook, webhook, project, admin, creator):
    rule_create(
        actor=admin,
        project=project,
        name="hot",
        event=Event.METRIC_ABOVE,
        personal=False,
        key="train.loss",
        threshold=5.0,
        consecutive=4,
        channel_ids=[hook.pk],
    )
    run = RunFactory(project=project, created_by=creator, name="hot-run")

    post(api, creator, run, loss(range(0, 6), lambda step: 9.0 if step in (1, 2, 4, 5) else 1.0))  # runs of 2
    assert webhook.received == []
    post(api, creator, run, loss(range(6, 8), lambda step: 9.0))  # 4, 5 + 6, 7: four in a row

    [received] = webhook.received
    assert received["body"]["title"] == "train.loss above 5 for 4 points in a row"


def test_a_loop_that_beats_but_logs_nothing_fires_the_stalled_rule_once(api, hook, webhook, project, admin, creator):
    rule_create(
        actor=admin,
        project=project,
        name="stalled",
        event=Event.METRIC_STALLED,
        personal=False,
        key="train.loss",
        stalled_minutes=2,
        channel_ids=[hook.pk],
    )
    run = RunFactory(project=project, created_by=creator, name="stuck", started_at=timezone.now())
    post(api, creator, run, loss(range(5)))
    beat = api(creator).post(f"/api/v1/runs/{run.pk}/heartbeat/")
    assert beat.status_code == 200
    now = timezone.now()

    assert stalled_runs_check(now=now + timedelta(minutes=1)) == 0  # logged a minute ago: fine
    assert stalled_runs_check(now=now + timedelta(minutes=3)) == 1
    assert stalled_runs_check(now=now + timedelta(minutes=4)) == 0  # the same stall fires once

    [received] = webhook.received
    assert received["body"]["title"] == "No new train.loss for 2 minutes"
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING  # it still beats: the reaper would not have noticed
    later = (now + timedelta(minutes=5)).timestamp()  # it logs again, then stalls again
    post(api, creator, run, [{"key": "train.loss", "value": 0.1, "step": 10, "timestamp": later}])
    assert stalled_runs_check(now=now + timedelta(minutes=6)) == 0
    assert stalled_runs_check(now=now + timedelta(minutes=8)) == 1


@pytest.mark.parametrize(
    ("beyond", "carried", "expected"),
    [([1, 1, 0, 1, 1, 1], 0, (3, 3)), ([1, 1, 0, 0], 5, (7, 0)), ([1, 1], 2, (4, 4)), ([0, 0], 9, (9, 0))],
)
def test_longest_run_carries_the_previous_batch(beyond, carried, expected):
    assert longest_run(np.array(beyond, dtype=bool), carried) == expected


def test_a_run_beyond_the_threshold_broken_by_a_quiet_batch_starts_again(api, hook, webhook, project, admin, creator):
    rule_create(
        actor=admin,
        project=project,
        name="hot",
        event=Event.METRIC_ABOVE,
        personal=False,
        key="train.loss",
        threshold=5.0,
        consecutive=3,
        channel_ids=[hook.pk],
    )
    run = RunFactory(project=project, created_by=creator, name="hot-run")

    post(api, creator, run, loss(range(0, 4), lambda step: 9.0 if step >= 2 else 1.0))  # ends with 2 beyond
    post(api, creator, run, loss(range(4, 6), lambda step: 1.0))  # a quiet batch breaks the run
    post(api, creator, run, loss(range(6, 7), lambda step: 9.0))  # 1 beyond: not 3 in a row
    assert webhook.received == []
    post(api, creator, run, loss(range(7, 9), lambda step: 9.0))  # 6, 7, 8: three in a row across batches
    assert len(webhook.received) == 1
