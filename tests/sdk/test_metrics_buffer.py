"""Metric buffering against a stub server: retry through an outage, drop a refused batch, bounded flush,
and the checks ``log_metrics`` makes before queueing anything."""

import json
import logging
import math
import os
import socket
import time

import pytest

import mado_tracking
from mado_tracking import client as client_module
from mado_tracking import metrics, points
from tests.sdk.stub_api import StubApi


@pytest.fixture(autouse=True)
def _fast_backoff(monkeypatch):
    monkeypatch.setattr(metrics, "BACKOFF_BASE_S", 0.05)
    monkeypatch.setattr(metrics, "BACKOFF_CAP_S", 0.2)


def _start(stub: StubApi, **kwargs):
    return mado_tracking.start_run(project="vision", api_url=stub.url, api_token="stub-token", **kwargs)


def test_it_keeps_points_through_a_briefly_unavailable_server():
    with StubApi(fail_metrics=3, fail_status=503) as stub:
        with _start(stub) as run:
            for step in range(5):
                run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    assert stub.posts[:3] == [503, 503, 503]
    assert stub.posts[-1] == 201
    assert [(p["step"], p["value"]) for p in stub.points] == [(s, 1.0 / (s + 1)) for s in range(5)]
    assert stub.statuses == ["finished"]


def test_it_retries_on_too_many_requests_too():
    with StubApi(fail_metrics=1, fail_status=429) as stub:
        with _start(stub) as run:
            run.log_metrics({"loss": 0.5}, step=0)
    assert stub.posts == [429, 201]
    assert len(stub.points) == 1


def test_it_drops_a_refused_batch_with_a_warning_naming_the_field(caplog):
    refusal = {"error": "invalid", "detail": "value must be a number", "field": "points[0].value"}
    with StubApi(refuse=refusal) as stub, caplog.at_level(logging.WARNING, logger="mado_tracking"):
        run = _start(stub)
        run.log_metrics({"loss": 1.0}, step=0)
        run._sender._wake.set()  # send this batch on its own, now
        while not stub.posts:
            run._sender._thread.join(0.01)
        run.log_metrics({"loss": 2.0}, step=1)
        run.finish()
    assert stub.posts == [400, 201]
    assert [p["value"] for p in stub.points] == [2.0]
    assert "points[0].value" in caplog.text
    assert run._sender.dropped == 1
    assert stub.statuses == ["finished"]


def test_finish_gives_up_on_a_dead_server_after_its_timeout_and_still_sets_the_status(caplog):
    with StubApi(fail_metrics=10**6) as stub, caplog.at_level(logging.WARNING, logger="mado_tracking"):
        run = _start(stub, flush_timeout=0.5)
        run.log_metrics({"loss": 1.0}, step=0)
        run.finish()
    assert stub.points == []
    assert stub.statuses == ["finished"]
    assert "1 metric points of run 1 could not be sent" in caplog.text


def test_log_metrics_never_waits_for_the_server():
    with StubApi() as stub:
        stub.release.clear()  # every metrics request hangs until released
        run = _start(stub)
        for step in range(3 * metrics.BATCH_MAX):
            run.log_metrics({"loss": 0.1}, step=step)
        assert run._sender.pending > 0  # everything was queued while the server hung
        stub.release.set()
        run.finish()
    assert len(stub.points) == 3 * metrics.BATCH_MAX


def test_batches_hold_at_most_ten_thousand_points():
    with StubApi() as stub:
        stub.release.clear()
        with _start(stub) as run:
            for step in range(25_000):
                run.log_metrics({"loss": float(step)}, step=step)
            stub.release.set()
    assert len(stub.points) == 25_000
    assert sorted(p["step"] for p in stub.points) == list(range(25_000))  # two batches in flight: either order
    assert max(stub.batch_sizes) == metrics.BATCH_MAX
    assert set(stub.posts) == {201}


def test_a_backlog_goes_out_two_batches_at_a_time_each_point_once():
    # Each post lasts 1.5 s, so the two batches sent together overlap even when a loaded machine starts the second
    # thread late (with 0.3 s, one CI run under load saw them one after the other).
    with StubApi(fail_metrics=1, fail_status=503, metrics_delay_s=1.5) as stub:
        stub.release.clear()  # the first full batch waits while the loop queues the rest
        with _start(stub) as run:
            for step in range(35_000):
                run.log_metrics({"loss": float(step)}, step=step)
            stub.release.set()
    assert stub.most_in_flight == 2  # behind the first (503, then stored): two full batches at once
    assert sorted(p["step"] for p in stub.points) == list(range(35_000))  # the retried one too, none twice
    assert stub.posts == [503, 201, 201, 201, 201] and len(set(stub.batch_keys)) == 4


@pytest.mark.parametrize(
    ("value", "wire"),
    [(1.5, 1.5), (math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity"), (0.0, 0.0)],
)
def test_non_finite_values_travel_as_strings(value, wire):
    point = json.loads(points.point_json(('a "quoted" ключ', value, 3, 1700000000.25)))
    assert point == {"key": 'a "quoted" ключ', "value": wire, "step": 3, "timestamp": 1700000000.25}
    body = json.loads(metrics.batch_body([("ok", 2.0, 3, 1.0), ('a "quoted" ключ', value, 4, 1700000000.25)]))
    assert body == {
        "keys": ["ok", 'a "quoted" ключ'],
        "steps": [3, 4],
        "values": [2.0, wire],
        "timestamps": [1.0, 1700000000.25],
    }


def test_the_run_is_created_with_a_client_chosen_run_id_and_the_token():
    with StubApi() as stub:
        with _start(stub, name="n1", parameters={"lr": 0.1}) as run:
            pass
    (body,) = stub.runs
    assert body == {
        "project": "vision",
        "kind": "training",
        "parameters": {"lr": 0.1},
        "name": "n1",
        "external_id": run.external_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    assert len(run.external_id) == 8


def test_a_retried_create_whose_first_answer_was_lost_makes_one_run(monkeypatch):
    monkeypatch.setattr(client_module.time, "sleep", lambda seconds: None)
    with StubApi(lose_create_answers=1) as stub:
        with _start(stub) as run:
            pass
    assert len(stub.runs) == 1
    assert run.external_id == stub.runs[0]["external_id"]
    assert stub.statuses == ["finished"]


def test_a_wrong_token_is_an_api_error_that_says_so():
    with StubApi() as stub:
        with pytest.raises(mado_tracking.ApiError, match="MMT_API_TOKEN") as caught:
            mado_tracking.start_run(project="vision", api_url=stub.url, api_token="wrong")
    assert caught.value.status == 401


@pytest.mark.parametrize(
    ("metrics", "step", "message"),
    [
        ({"loss": 1.0}, -1, "step must be an int >= 0"),
        ({"loss": 1.0}, 1.5, "step must be an int >= 0"),
        ({"loss": 1.0}, True, "step must be an int >= 0"),
        ({"loss": 1.0}, "3", "step must be an int >= 0"),
        ({"loss": "low"}, 0, "'loss'"),
        ({"loss": None}, 0, "'loss'"),
        ({"ok": 1.0, "flag": True}, 0, "'flag'"),
        ({"": 1.0}, 0, "non-empty str"),
        ({3: 1.0}, 0, "non-empty str"),
        ({"k" * 251: 1.0}, 0, "at most 250"),
        ({"loss\x00": 1.0}, 0, "without NUL"),  # the server refuses it, and with it the whole batch
        ({"loss\udc80": 1.0}, 0, "lone surrogate"),  # not UTF-8: refused here, not dropped with its batch
        ({"loss": 1.0}, 2**63, "below 2\\*\\*63"),  # the server's BIGINT
    ],
)
def test_bad_steps_keys_and_values_are_refused_at_call_time(metrics, step, message):
    with StubApi() as stub, _start(stub) as run:
        with pytest.raises(ValueError, match=message):
            run.log_metrics(metrics, step=step)
        run.log_metrics({"loss": 0.5}, step=0)
    assert [(p["key"], p["step"]) for p in stub.points] == [("loss", 0)]  # nothing of a refused call was queued


def test_a_non_mapping_is_a_type_error():
    with StubApi() as stub, _start(stub) as run:
        with pytest.raises(TypeError, match="dict"):
            run.log_metrics([("loss", 1.0)], step=0)


def test_each_batch_carries_its_own_idempotency_key_reused_on_its_retries():
    with StubApi(fail_metrics=2, fail_status=503) as stub:
        run = _start(stub)
        run.log_metrics({"loss": 1.0}, step=0)
        assert run._sender.flush(10) == 0
        run.log_metrics({"loss": 2.0}, step=1)
        run.finish()
    assert stub.posts == [503, 503, 201, 201]
    first, second = stub.batch_keys[0], stub.batch_keys[3]
    assert stub.batch_keys == [first, first, first, second]
    assert first and second and first != second


def test_flush_waits_until_the_queued_points_are_stored():
    with StubApi() as stub:
        run = _start(stub)
        for step in range(5):
            run.log_metrics({"loss": 0.1}, step=step)
        assert run._sender.flush(10) == 0
        assert len(stub.points) == 5  # before finish: the sender's one-second interval did not have to pass
        run.finish()


def test_a_steady_loop_posts_about_once_per_interval_not_back_to_back(monkeypatch):
    """With many writers, a request always in flight per writer would be the server's queue
    (docs/design/resume.md#steps-continue)."""
    monkeypatch.setattr(metrics, "FLUSH_INTERVAL_S", 0.5)
    with StubApi(metrics_delay_s=0.2) as stub:
        with _start(stub) as run:
            for step in range(40):  # 2 s of a loop logging every 50 ms
                run.log_metrics({"loss": float(step)}, step=step)
                time.sleep(0.05)
    assert sorted(p["step"] for p in stub.points) == list(range(40))
    # back to back, a post every 0.2 s would make about ten; one per 0.5 s (±50 %) and the last flush, about five
    assert len(stub.posts) <= 7, stub.posts
