"""Metric ingestion through PostgreSQL COPY, history reads and their statement timeout on a real PostgreSQL."""

import json
import math

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from mado.db import read_statement_timeout
from mado.errors import ValidationFailed
from runs import history as history_module
from runs import selectors
from runs.history import metric_history_json
from runs.metrics import metrics_ingest
from runs.models import MetricChunk, MetricPoint


def test_copy_ingest_stores_every_point_including_non_finite(postgres, run, creator):
    points = [{"key": "loss", "value": 1.0 / (s + 1), "step": s, "timestamp": 1_700_000_000 + s} for s in range(5000)]
    points += [{"key": "loss", "value": "NaN", "step": 5000}, {"key": "loss", "value": "-Infinity", "step": 5001}]
    assert metrics_ingest(actor=creator, run=run, points=points).stored == 5002
    history = selectors.metric_history(run=run, key="loss")
    assert len(history) == 5002
    assert history[10] == (10, 1.0 / 11, (1_700_000_000 + 10) * 1000)
    assert math.isnan(history[-2][1]) and history[-1][1] == -math.inf


def test_a_refused_batch_leaves_nothing_on_postgres(postgres, run, creator):
    with pytest.raises(ValidationFailed):
        metrics_ingest(
            actor=creator, run=run, points=[{"key": "a", "value": 1, "step": 0}, {"key": "a", "value": 1, "step": -3}]
        )
    assert selectors.metric_history(run=run, key="a") == []


@pytest.mark.django_db(transaction=True)  # the block's own transaction ends the SET LOCAL, as in a request
def test_metric_reads_run_under_the_read_statement_timeout_and_leave_the_connection_without_it(postgres, settings):
    settings.MADO_READ_STATEMENT_TIMEOUT_MS = 50
    with connection.cursor() as cursor:
        with read_statement_timeout():
            cursor.execute("SHOW statement_timeout")
            assert cursor.fetchone()[0] == "50ms"
        with pytest.raises(OperationalError, match="statement timeout"):
            with read_statement_timeout():
                cursor.execute("SELECT pg_sleep(1)")  # a read that would hold a web thread
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == "0"


def _indexes(table: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s ORDER BY indexname", [table])
        return [row[0] for row in cursor.fetchall()]


def _loss(run) -> list[tuple]:
    return list(
        MetricPoint.objects.filter(run=run, key="loss").order_by("step", "id").values_list("id", "step", "value")
    )


def test_a_batch_is_one_chunk_per_key_whose_points_keep_increasing_ids_and_leave_with_their_run(postgres, run, creator):
    metrics_ingest(
        actor=creator,
        run=run,
        columns={"keys": ["loss", "acc"] * 3, "steps": [2, 0, 0, 1, 1, 2], "values": [1, 2, 3, 4, 5, 6]},
    )
    metrics_ingest(actor=creator, run=run, columns={"keys": ["loss"], "steps": [2], "values": [7]})
    chunks = list(MetricChunk.objects.filter(run=run).order_by("id").values_list("key", "steps", "values", "count"))
    # Sorted by step inside a chunk; one row per key and batch, not per point.
    assert chunks == [
        ("acc", [0, 1, 2], [2.0, 4.0, 6.0], 3),
        ("loss", [0, 1, 2], [3.0, 5.0, 1.0], 3),
        ("loss", [2], [7.0], 1),
    ]
    rows = _loss(run)
    ids = [row[0] for row in rows]
    assert len(set(ids)) == len(ids) and [row[2] for row in rows] == [3, 5, 1, 7]
    assert ids[-1] > ids[-2]  # the point stored last at step 2 comes last
    run_id = run.pk
    with CaptureQueriesContext(connection) as queries:
        run.delete()
    on_points = [q["sql"] for q in queries.captured_queries if "runs_metric" in q["sql"] and "DELETE" in q["sql"]]
    # One statement by run id on the chunks, never chunks fetched and deleted by id, nothing on the view.
    assert [sql.startswith('DELETE FROM "runs_metricchunk" WHERE') for sql in on_points].count(True) == 1
    assert not any("runs_metricpoint" in sql for sql in on_points)
    assert (
        not MetricPoint.objects.filter(run_id=run_id).exists()
        and not MetricChunk.objects.filter(run_id=run_id).exists()
    )


def test_a_history_page_of_a_key_logged_in_step_order_reads_only_the_chunks_it_spans(postgres, run, creator):
    for start in range(0, 5000, 1000):  # five batches, five chunks of "loss"
        metrics_ingest(
            actor=creator,
            run=run,
            columns={
                "keys": ["loss"] * 1000,
                "steps": list(range(start, start + 1000)),
                "values": [float(s) for s in range(start, start + 1000)],
            },
        )
    with CaptureQueriesContext(connection) as queries:
        page = json.loads(metric_history_json(run=run, key="loss", offset=2500, limit=1000))
    assert [p["step"] for p in page] == list(range(2500, 3500))
    assert len(queries.captured_queries) == 1  # the chunks were in order: no second read through the view
    with CaptureQueriesContext(connection) as queries:  # the rows the MLflow get-history pages read
        rows = selectors.metric_history(run=run, key="loss", offset=2500, limit=1000)
    assert [row[:2] for row in rows] == [(s, float(s)) for s in range(2500, 3500)]
    assert len(queries.captured_queries) == 1 and "runs_metricpoint" not in queries.captured_queries[0]["sql"]
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + history_module._PG_PAGE,
            {"run": run.pk, "key": "loss", "offset": 2500, "limit": 1000, "end": 3500},
        )
        plan = cursor.fetchone()[0][0]["Plan"]
    unnested = [
        node["Actual Rows"] * node["Actual Loops"] for node in _nodes(plan) if node["Node Type"] == "Function Scan"
    ]
    # Two chunks unnested (steps 2000-2999 and 3000-3999), 500 points of each: not the key's 5,000 points.
    assert unnested == [1000]


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):  # the InitPlan of ``ordered`` and the page's nodes
        yield from _nodes(child)


def test_a_key_logged_out_of_step_order_is_still_paged_by_step(postgres, run, creator):
    for steps in ([10, 11, 12], [0, 1, 2], [5, 11, 20]):  # the second batch starts below the first one's end
        metrics_ingest(
            actor=creator, run=run, columns={"keys": ["loss"] * 3, "steps": steps, "values": [float(s) for s in steps]}
        )
    page = json.loads(metric_history_json(run=run, key="loss", offset=2, limit=5))
    assert [p["step"] for p in page] == [2, 5, 10, 11, 11]
    assert page == json.loads(
        history_module._rows_json(selectors.metric_history(run=run, key="loss", offset=2, limit=5))
    )


@pytest.mark.django_db(transaction=True)
def test_the_points_table_comes_back_with_every_point_when_the_migration_is_reversed(postgres, run, creator):
    from django.core.management import call_command

    metrics_ingest(
        actor=creator,
        run=run,
        columns={"keys": ["loss"] * 4, "steps": [3, 0, 1, 1], "values": [1.0, "NaN", "-Infinity", 2.5]},
    )
    before = [row[1:] for row in _loss(run)]
    call_command("migrate", "runs", "0015", verbosity=0)
    try:
        assert len(_indexes("runs_metricpoint")) == 1 and "(run_id, key, step, id)" in _indexes("runs_metricpoint")[0]
        with connection.cursor() as cursor:
            cursor.execute("SELECT step, value FROM runs_metricpoint WHERE run_id = %s ORDER BY step, id", [run.pk])
            assert cursor.fetchall() == before
    finally:  # every app: going back also unapplied the migrations of apps that depend on runs
        call_command("migrate", verbosity=0)
    assert [row[1:] for row in _loss(run)] == before
    assert MetricChunk.objects.filter(run=run).values_list("count", flat=True).get() == 4
    assert before[0][1] is None and before[1][1] == -math.inf
