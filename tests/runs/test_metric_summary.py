"""The per-run, per-key metric summary: kept by the write path, equal to a recomputation, read by "keys", "count",
the last step of a resume and the sweep's trial metric (docs/design/resume.md#steps-continue;
docs/design/runs.md#resume-modes)."""

import itertools
import math
from importlib import import_module
from types import SimpleNamespace

from django.apps import apps
from django.db import connection
from hypothesis import HealthCheck, given, settings

from runs import selectors
from runs.metrics import metrics_ingest
from runs.models import MetricSummary, Run
from runs.resume import run_last_step
from tests.runs.metric_helpers import PROGRAM, play, recomputed, store_points_directly, stored

NAMES = itertools.count()


def test_a_batch_leaves_per_key_figures_that_match_the_points(run, creator):
    metrics_ingest(
        actor=creator,
        run=run,
        points=[
            {"key": "loss", "value": 3.0, "step": 5, "timestamp": 10},
            {"key": "loss", "value": "NaN", "step": 7, "timestamp": 12},
            {"key": "loss", "value": 1.0, "step": 7, "timestamp": 11},
            {"key": "acc", "value": "-Infinity", "step": 2, "timestamp": 9},
        ],
    )
    summary = {s.key: s for s in MetricSummary.objects.filter(run=run)}
    loss = summary["loss"]
    assert (loss.count, loss.first_step, loss.last_step) == (3, 5, 7)
    assert loss.last_value == 1.0  # the point stored last at the highest step
    assert (loss.min_value, loss.max_value) == (1.0, 3.0)  # NaN is no minimum
    assert (loss.first_timestamp, loss.last_timestamp) == (10_000, 12_000)
    assert summary["acc"].min_value == -math.inf == summary["acc"].max_value
    assert stored(run.pk) == recomputed(run.pk)


def test_keys_count_and_last_step_come_from_the_summary(run, creator):
    metrics_ingest(actor=creator, run=run, columns={"keys": ["b", "a", "a"], "steps": [9, 1, 4], "values": [1, 2, 3]})
    assert selectors.metric_keys(run=run) == ["a", "b"]
    assert selectors.metric_count(run=run, key="a") == 2 and selectors.metric_count(run=run, key="zzz") == 0
    assert run_last_step(run_id=run.pk) == 9
    assert selectors.run_first_metric_step(run=run) == 1
    MetricSummary.objects.filter(run=run).update(last_step=99)  # the points are not read again
    assert run_last_step(run_id=run.pk) == 99


def test_a_replayed_batch_and_dropped_points_leave_the_summary_alone(run, creator):
    batch = [{"key": "loss", "value": 1.0, "step": 3}]
    metrics_ingest(actor=creator, run=run, points=batch, idempotency_key="k1")
    metrics_ingest(actor=creator, run=run, points=batch, idempotency_key="k1")
    run.step_floor = 10
    metrics_ingest(
        actor=creator,
        run=run,
        points=[{"key": "loss", "value": 9.0, "step": 2}, {"key": "new", "value": 9.0, "step": 4}],
    )
    assert stored(run.pk) == recomputed(run.pk)
    assert selectors.metric_keys(run=run) == ["loss"] and selectors.metric_count(run=run, key="loss") == 1


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=PROGRAM)
def test_the_summary_equals_a_recomputation_after_any_program_on_sqlite(program, project, creator):
    play(program, actor=creator, project=project, name=f"h{next(NAMES)}")


def test_the_upgrade_fills_summaries_of_points_stored_before_it(run, creator, project):
    other = Run.objects.create(project=project, created_by=creator, name="other")
    store_points_directly(
        [(run, "loss", s, v, 1000 + s) for s, v in [(0, 2.0), (1, None), (1, -1.0), (5, float("inf")), (3, 0.5)]]
        + [(other, "acc", 2, None, 7)]
    )
    backfill = import_module("runs.migrations.0008_metric_summary").backfill_summaries
    backfill(apps, SimpleNamespace(connection=connection))  # it only runs SQL on the editor's connection
    assert stored(run.pk) == recomputed(run.pk)
    assert stored(run.pk)["loss"] == (5, 0, 5, float("inf"), -1.0, float("inf"), 1000, 1005)
    assert stored(other.pk) == {"acc": (1, 2, 2, None, None, None, 7, 7)}
