"""Points stored as chunks and read through the ``runs_metricpoint`` view (docs/design/resume.md#steps-continue), on
SQLite here and on PostgreSQL in ``make test-integration`` (with tests/integration/test_postgres_metrics.py)."""

import json
import math

import pytest
from django.core.management import call_command
from django.db import connection

from runs import selectors
from runs.history import metric_history_json
from runs.metrics import SQLITE_CHUNK_POINTS, metrics_ingest
from runs.models import MetricChunk, MetricPoint
from runs.models.arrays import json_numbers

EDGES = [0.0, -0.0, 5e-324, -1.7976931348623157e308, 0.1 + 0.2, 1 / 3, math.inf, -math.inf, math.nan]


def test_every_float_comes_back_exactly_through_the_view(run, creator):
    values = ["NaN" if math.isnan(v) else v for v in EDGES]
    metrics_ingest(
        actor=creator,
        run=run,
        columns={"keys": ["x"] * len(values), "steps": list(range(len(values))), "values": values},
    )
    back = [value for _step, value, _ts in selectors.metric_history(run=run, key="x")]
    assert [repr(v) for v in back] == [repr(v) for v in EDGES]  # -0.0 and the smallest subnormal included


def test_json_numbers_writes_what_sqlite_reads_back(db):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's JSON text arrays; PostgreSQL stores native arrays")
    with connection.cursor() as cursor:
        cursor.execute("SELECT value FROM json_each(%s)", [json_numbers([1, None, math.nan, math.inf, -math.inf, 2.5])])
        assert [row[0] for row in cursor.fetchall()] == [1, None, None, math.inf, -math.inf, 2.5]


def test_a_large_batch_is_cut_into_chunks_sorted_by_step_with_ids_in_stored_order(run, creator):
    size = 2 * SQLITE_CHUNK_POINTS + 7
    cut = SQLITE_CHUNK_POINTS if connection.vendor == "sqlite" else size  # PostgreSQL: one chunk per key and batch
    steps = list(reversed(range(size)))  # sent in reverse: stored sorted
    metrics_ingest(
        actor=creator, run=run, columns={"keys": ["loss"] * size, "steps": steps, "values": [float(s) for s in steps]}
    )
    metrics_ingest(actor=creator, run=run, columns={"keys": ["loss"], "steps": [5], "values": [-1.0]})
    chunks = list(MetricChunk.objects.filter(run=run).order_by("id").values_list("first_step", "last_step", "count"))
    assert chunks == [(start, min(start + cut, size) - 1, min(cut, size - start)) for start in range(0, size, cut)] + [
        (5, 5, 1)
    ]
    page = [(p.step, p.value) for p in MetricPoint.objects.filter(run=run, key="loss").order_by("step", "id")[4:8]]
    assert page == [(4, 4.0), (5, 5.0), (5, -1.0), (6, 6.0)]  # the later point at step 5 after the first
    stamps = [ts / 1000 for _s, _v, ts in selectors.metric_history(run=run, key="loss", offset=5, limit=2)]
    # The second batch reaches below the first one's end: PostgreSQL pages it through the view, sorted.
    assert json.loads(metric_history_json(run=run, key="loss", offset=5, limit=2)) == [
        {"step": 5, "value": 5.0, "timestamp": stamps[0]},
        {"step": 5, "value": -1.0, "timestamp": stamps[1]},
    ]


def test_at_steps_reads_the_points_in_range_from_the_chunks_reaching_it(run, creator):
    for start in (0, 100, 200):
        metrics_ingest(
            actor=creator,
            run=run,
            columns={"keys": ["loss"] * 100, "steps": list(range(start, start + 100)), "values": [1.0] * 100},
        )
    points = MetricPoint.objects.filter(run=run, key="loss").at_steps(150, 210)
    assert sorted(points.values_list("step", flat=True)) == list(range(150, 211))
    assert set(points.values_list("chunk_first_step", flat=True)) == {100, 200}


@pytest.mark.one_database  # on PostgreSQL: tests/integration/test_postgres_metrics.py
@pytest.mark.django_db(transaction=True)
def test_the_points_table_comes_back_with_every_point_when_the_migration_is_reversed(run, creator):
    metrics_ingest(
        actor=creator,
        run=run,
        columns={"keys": ["loss", "acc", "loss"], "steps": [3, 0, 1], "values": ["NaN", 2.0, -math.inf]},
    )
    before = sorted(MetricPoint.objects.filter(run=run).values_list("key", "step", "value", "timestamp"))
    call_command("migrate", "runs", "0015", verbosity=0)
    try:
        with connection.cursor() as cursor:
            cursor.execute('SELECT key, step, value, "timestamp" FROM runs_metricpoint WHERE run_id = %s', [run.pk])
            assert sorted(cursor.fetchall()) == before
    finally:  # every app: going back also unapplied the migrations of apps that depend on runs
        call_command("migrate", verbosity=0)
    assert sorted(MetricPoint.objects.filter(run=run).values_list("key", "step", "value", "timestamp")) == before
    assert sorted(MetricChunk.objects.filter(run=run).values_list("key", "count")) == [("acc", 1), ("loss", 2)]
