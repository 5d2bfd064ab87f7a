"""Heartbeats never wait behind a retrying metric batch; points for a crashed Run wait for its resume
(docs/design/runs.md#liveness).

Against the real API (live server); the reaper is called by the test, time is never asserted.
"""

import json
import math
import threading
import time
from datetime import timedelta

import pytest
from django.http import JsonResponse
from django.utils import timezone

import mado_tracking
from runs.api.runs import RunMetricsApi
from runs.liveness import runs_reap_crashed
from runs.models import MetricPoint, Run, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)


def _wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def metrics_outage(monkeypatch):
    """While the returned Event is set, ``POST runs/{id}/metrics/`` answers 503 (and counts the refusals)."""
    outage, refused = threading.Event(), []
    real_post = RunMetricsApi.post

    def post(self, request, run_id):
        if outage.is_set():
            refused.append(run_id)
            return JsonResponse({"error": "unavailable", "detail": "metrics store down", "field": None}, status=503)
        return real_post(self, request, run_id)

    monkeypatch.setattr(RunMetricsApi, "post", post)
    outage.refused = refused
    return outage


def test_a_live_process_stays_running_through_a_metrics_outage_longer_than_the_crash_timeout(
    mmt_env, monkeypatch, settings, metrics_outage
):
    settings.MMT_CRASH_TIMEOUT = 1
    monkeypatch.setenv("MMT_HEARTBEAT_INTERVAL", "0.2")
    metrics_outage.set()
    with mado_tracking.start_run(id="through-the-outage") as run:
        for step in range(50):
            run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
        _wait_for(lambda: len(metrics_outage.refused) >= 2)  # the batch is being retried
        outage_began = Run.objects.get(pk=run.id).heartbeat_at
        # Past the crash timeout, heartbeats still arrive: the reaper finds nothing stale.
        _wait_for(lambda: Run.objects.get(pk=run.id).heartbeat_at > outage_began + timedelta(seconds=1.5))
        assert runs_reap_crashed() == 0
        assert Run.objects.get(pk=run.id).status == RunStatus.RUNNING and not MetricPoint.objects.exists()
        metrics_outage.clear()
    stored = Run.objects.get(pk=run.id)
    assert stored.status == RunStatus.FINISHED and not run.lost
    assert list(MetricPoint.objects.filter(run=stored).order_by("step").values_list("step", flat=True)) == list(
        range(50)
    )


def test_points_refused_for_a_crashed_run_are_kept_and_sent_by_its_resume(mmt_env, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("MMT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MMT_HEARTBEAT_INTERVAL", "3600")  # the reaper decides, not a heartbeat answer
    first = mado_tracking.start_run(id="killed-by-reaper")
    for step in range(3):
        first.log_metrics({"loss": float(step)}, step=step)
    _wait_for(lambda: MetricPoint.objects.filter(run_id=first.id).count() == 3)
    Run.objects.filter(pk=first.id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert runs_reap_crashed() == 1
    for step in range(3, 6):
        first.log_metrics({"loss": float(step)}, step=step)
    _wait_for(lambda: first.lost)
    first.log_metrics({"loss": 6.0}, step=6)  # after the loss: kept too
    first.finish()
    assert MetricPoint.objects.filter(run_id=first.id).count() == 3  # nothing stored into the crashed run
    kept = list((tmp_path / "cache").rglob("unsent-metrics.jsonl"))
    assert len(kept) == 1 and [int(json.loads(line)[2]) for line in kept[0].read_text().splitlines()] == [3, 4, 5, 6]

    with mado_tracking.start_run(id="killed-by-reaper", resume="allow") as again:
        assert again.resumed and again.id == first.id
    steps = list(MetricPoint.objects.filter(run_id=first.id).order_by("step").values_list("step", flat=True))
    assert steps == [0, 1, 2, 3, 4, 5, 6] and not kept[0].exists()


def test_a_cut_last_line_of_the_kept_points_is_skipped(tmp_path):
    from mado_tracking import unsent

    point = ("loss", 1.0, 3, 1700000000.5)
    unsent.keep(tmp_path, [point], run_label="r")
    with open(tmp_path / unsent.FILE_NAME, "a") as spool:
        spool.write('["loss", 2.')
    assert unsent.take(tmp_path) == [point]
    assert unsent.take(tmp_path) == []


def test_kept_points_round_trip_non_finite_values_and_lines_of_earlier_sdks(tmp_path):
    from mado_tracking import unsent

    unsent.keep(tmp_path, [("a", math.inf, 1, 2.5), ("b", -math.inf, 1, 2.5), ("c", math.nan, 1, 2.5)], run_label="r")
    with open(tmp_path / unsent.FILE_NAME, "a") as spool:  # an earlier SDK kept each field's JSON text
        spool.write('["\\"loss\\"", "\\"NaN\\"", "3", "1700000000.5"]\n["\\"lr\\"", "0.5", "3", "1700000000.5"]\n')
        for garbage in (
            ["x", "not a number", 1, 2.5],
            ["x", 1.0, "one", 2.5],
            {"key": "x"},
            ["x", 10**400, 1, 2.5],
            ["x\ud800", 1.0, 1, 2.5],
            ["", 1.0, 1, 2.5],
            ["x\x00", 1.0, 1, 2.5],
            ["x", 1.0, -5, 2.5],
            ["x", 1.0, 2**63, 2.5],
            ["x", 1.0, 1, -3],
            ["x", 1.0, 1, True],
            ["x", True, 1, 2.5],
            ['"x"', '"NaN"', '" 3_0 "', '"1"'],
            ['"x"', "1" * 400, '"1"', '"1"'],
        ):
            spool.write(json.dumps(garbage) + "\n")  # not points the server would take: skipped, never a crash
    taken = unsent.take(tmp_path)
    assert [(key, step, stamp) for key, _, step, stamp in taken] == [
        ("a", 1, 2.5),
        ("b", 1, 2.5),
        ("c", 1, 2.5),
        ("loss", 3, 1700000000.5),
        ("lr", 3, 1700000000.5),
    ]
    values = [value for _, value, _, _ in taken]
    assert values[:2] == [math.inf, -math.inf] and math.isnan(values[2]) and math.isnan(values[3])
    assert values[4] == 0.5
