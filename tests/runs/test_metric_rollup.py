"""The per-bucket metric rollup: filled by the upgrade like the write path fills it, and what a chart of a large key
is read from, giving what the points would give (docs/design/resume.md#steps-continue;
docs/design/interfaces.md#workspace). The write path's rollups are checked against a recomputation after random programs
in test_metric_summary.py (``play``)."""

import math
import random
from importlib import import_module
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.db import connection

from runs import selectors
from runs.metric_rollup import ROLLUP_STEPS
from runs.metrics import metrics_ingest
from runs.models import MetricChunk, MetricPoint, MetricRollup, Run
from tests.runs.metric_helpers import recomputed_rollups, store_points_directly, stored_rollups

R = ROLLUP_STEPS


def test_the_upgrade_fills_rollups_of_points_stored_before_it(run, creator, project):
    other = Run.objects.create(project=project, created_by=creator, name="other")
    store_points_directly(
        [
            (run, "loss", s, v, 1000 + s)
            for s, v in [
                (0, 2.0),
                (1, None),
                (1, -1.0),
                (5, math.inf),
                (3, -1.0),
                (R + 6, 0.5),
                (R, 0.5),
                (3 * R, None),
            ]
        ]
        + [(other, "acc", 2, -math.inf, 7)]
    )
    backfill = import_module("runs.migrations.0011_metric_rollup").backfill_rollups
    backfill(apps, SimpleNamespace(connection=connection))  # it only runs SQL on the editor's connection
    assert stored_rollups(run.pk) == recomputed_rollups(run.pk)
    assert stored_rollups(run.pk)[("loss", 0)] == (5, 2, 1, -1.0, 1001, 0, 2.0, 1000)
    assert stored_rollups(run.pk)[("loss", 1)] == (2, 0, R, 0.5, 1000 + R, R, 0.5, 1000 + R)
    assert stored_rollups(run.pk)[("loss", 3)] == (1, 1, None, None, None, None, None, None)
    assert stored_rollups(other.pk) == {("acc", 0): (1, 1, None, None, None, None, None, None)}


def from_points(run, key: str, max_points: int, before_step: int = 2**63) -> list[tuple]:
    """The chart a key's points (below ``before_step``) give when its buckets are whole rollup buckets: per part of
    ``k`` rollup buckets the points holding the smallest and largest finite value (lowest step, then first stored),
    by step."""
    rows = list(
        MetricPoint.objects.filter(run=run, key=key, step__lt=before_step)
        .order_by("id")
        .values_list("step", "value", "timestamp")
    )
    low = min(s for s, _v, _t in rows) // ROLLUP_STEPS
    spanned = max(s for s, _v, _t in rows) // ROLLUP_STEPS - low + 1
    per = -(-spanned // (max_points // 2))
    parts: dict[int, list] = {}
    for step, value, ts in rows:
        if value is not None and math.isfinite(value):
            parts.setdefault((step // ROLLUP_STEPS - low) // per, []).append((step, value, ts))
    kept = set()
    for points in parts.values():
        kept.add(min(points, key=lambda p: (p[1], p[0])))
        kept.add(min(points, key=lambda p: (-p[1], p[0])))
    return sorted(kept, key=lambda p: (p[0], p[1]))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_large_keys_chart_comes_from_its_rollups_and_equals_what_its_points_give(run, creator, seed):
    rng = random.Random(seed)
    steps = sorted(rng.sample(range(3 * ROLLUP_STEPS, 200 * ROLLUP_STEPS), 3000))
    values = [rng.choice([rng.random(), round(rng.random(), 1), "NaN", "Infinity"]) for _ in steps]
    values[1234] = 1e6  # a spike a plain stride would miss
    for start in range(0, len(steps), 700):  # several batches: rollup rows are folded across them
        metrics_ingest(
            actor=creator,
            run=run,
            columns={
                "keys": ["loss"] * len(steps[start : start + 700]),
                "steps": steps[start : start + 700],
                "values": values[start : start + 700],
            },
        )
    bad = sum(1 for v in values if v in ("NaN", "Infinity"))
    points, non_finite, total = selectors.metric_chart_series(run=run, key="loss", max_points=200, with_timestamps=True)
    assert (non_finite, total) == (bad, 3000)
    assert points == from_points(run, "loss", 200)
    assert 100 <= len(points) <= 200 and (steps[1234], 1e6) in {(s, v) for s, v, _t in points}
    MetricChunk.objects.filter(run=run).delete()  # the chart does not read the points
    assert selectors.metric_chart_series(run=run, key="loss", max_points=200, with_timestamps=True)[0] == points
    assert selectors.metric_chart_series(run=run, key="loss", max_points=200)[0] == [(s, v) for s, v, _t in points]


def test_a_key_narrower_than_the_chart_is_read_from_its_points(run, creator):
    # 2R points over R steps (one rollup bucket) for a 100-point chart: rollup buckets would be far too coarse.
    metrics_ingest(
        actor=creator,
        run=run,
        columns={
            "keys": ["loss"] * 2 * R,
            "steps": [s // 2 for s in range(2 * R)],
            "values": [float(s % 7) for s in range(2 * R)],
        },
    )
    points, _bad, total = selectors.metric_chart_series(run=run, key="loss", max_points=100)
    assert total == 2 * R and 50 <= len(points) <= 100  # some 50 buckets of a few steps, not 1 rollup bucket


def test_the_history_api_answers_a_downsampled_series_as_columns(client_as, run, creator):
    values = [1.0] * 20 * ROLLUP_STEPS
    values[700] = 50.0
    metrics_ingest(
        actor=creator,
        run=run,
        columns={
            "keys": ["loss"] * len(values),
            "steps": list(range(len(values))),
            "values": values,
            "timestamps": [1700000000.5] * len(values),
        },
    )
    url = f"/api/v1/runs/{run.pk}/metrics/?key=loss&max_points=20"
    points = client_as("viewer").get(url + "&shape=points").json()
    body = client_as("viewer").get(url).json()
    assert client_as("viewer").get(url + "&shape=columns").json() == body
    assert body["count"] == len(values) and body["non_finite"] == 0 and body["next"] is None
    assert body["results"] == {
        "steps": [p["step"] for p in points["results"]],
        "values": [p["value"] for p in points["results"]],
        "timestamps": [1700000000.5] * len(points["results"]),
    }
    assert 50.0 in body["results"]["values"] and len(body["results"]["steps"]) <= 20


@pytest.mark.parametrize(
    "query",
    [
        "max_points=20&shape=rows",
        "max_points=20&shape=",
        "shape=columns",
        "max_points=20&shape=%00",
        "max_points=20&shape=" + "c" * 5000,
    ],
)
def test_a_bad_shape_is_refused_naming_it(client_as, run, creator, query):
    metrics_ingest(actor=creator, run=run, points=[{"key": "loss", "value": 1.0, "step": 0}])
    response = client_as("viewer").get(f"/api/v1/runs/{run.pk}/metrics/?key=loss&{query}")
    if query.endswith("shape="):  # an empty value is the default
        assert response.status_code == 200 and response.json()["results"]["steps"] == [0]
    else:
        assert response.status_code == 400 and response.json()["field"] == "shape"
    assert MetricRollup.objects.filter(run=run).count() == 1


def test_an_ancestors_curve_up_to_a_step_comes_from_its_rollups_and_the_points_of_that_steps_bucket(run, creator):
    steps = list(range(0, 100 * R, 7))
    values = [((s * 7919) % 1000) / 1000 for s in steps]
    values[steps.index(50 * R + 3)] = -40.0  # a dip inside the bucket cut by before_step, below it
    values[steps.index(50 * R + 10)] = 90.0  # a spike in the same bucket, at or above before_step: not drawn
    cut = steps.index(50 * R + 3)  # two batches: the first one's chunks hold the points below 50 * R only
    for part in (slice(None, cut), slice(cut, None)):
        metrics_ingest(
            actor=creator,
            run=run,
            columns={"keys": ["loss"] * len(steps[part]), "steps": steps[part], "values": values[part]},
        )
    before = 50 * R + 5
    points, non_finite, total = selectors.metric_chart_series(
        run=run, key="loss", max_points=100, before_step=before, with_timestamps=True
    )
    assert (non_finite, total) == (0, sum(1 for s in steps if s < before))
    assert points == from_points(run, "loss", 100, before_step=before)
    assert (50 * R + 3, -40.0) in {(s, v) for s, v, _t in points} and max(s for s, _v, _t in points) < before
    MetricChunk.objects.filter(run=run, last_step__lt=50 * R).delete()  # whole buckets come from the rollups
    assert (
        selectors.metric_chart_series(run=run, key="loss", max_points=100, before_step=before, with_timestamps=True)[0]
        == points
    )
