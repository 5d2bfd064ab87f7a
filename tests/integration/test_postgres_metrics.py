"""Metric ingestion through PostgreSQL COPY, history reads and their statement timeout on a real PostgreSQL."""

import math

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from mado.db import read_statement_timeout
from mado.errors import ValidationFailed
from runs import selectors
from runs.metrics import metrics_ingest
from runs.models import MetricPoint


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
        metrics_ingest(actor=creator, run=run, points=[{"key": "a", "value": 1, "step": 0}, {"key": "a", "value": 1, "step": -3}])
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


def _points_indexes() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'runs_metricpoint' ORDER BY indexname")
        return [row[0] for row in cursor.fetchall()]


def test_points_keep_one_index_and_increasing_ids_and_leave_with_their_run(postgres, run, creator):
    # One B-tree per stored point, not two: the primary-key index on id is gone (migration 0015).
    assert len(_points_indexes()) == 1 and "(run_id, key, step, id)" in _points_indexes()[0]
    metrics_ingest(actor=creator, run=run, columns={"keys": ["loss", "acc"] * 3, "steps": [0, 0, 1, 1, 2, 2],
                                                     "values": [1, 2, 3, 4, 5, 6]})
    metrics_ingest(actor=creator, run=run, columns={"keys": ["loss"], "steps": [2], "values": [7]})
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, value FROM runs_metricpoint WHERE run_id = %s AND key = 'loss' "
                       "ORDER BY step, id", [run.pk])
        rows = cursor.fetchall()
        cursor.execute("SET LOCAL enable_seqscan = off")  # a few rows: show what a big table would get
        cursor.execute("EXPLAIN SELECT step, value FROM runs_metricpoint WHERE run_id = %s AND key = 'loss' "
                       "ORDER BY step, id", [run.pk])
        plan = " ".join(row[0] for row in cursor.fetchall())
    ids = [row[0] for row in rows]
    assert len(set(ids)) == len(ids) and [row[1] for row in rows] == [1, 3, 5, 7]
    assert ids[-1] > ids[-2]  # the point stored last at step 2 comes last
    assert "Index Scan" in plan and "Sort" not in plan  # read in index order: no sort of the key's points
    with CaptureQueriesContext(connection) as queries:
        run.delete()
    on_points = [q["sql"] for q in queries.captured_queries if "runs_metricpoint" in q["sql"]]
    # One statement by run id, never points fetched and deleted by id (a table scan each, without the id index).
    assert len(on_points) == 1 and on_points[0].startswith('DELETE FROM "runs_metricpoint" WHERE')
    assert "run_id" in on_points[0] and '"id" IN' not in on_points[0]
    assert not MetricPoint.objects.filter(run_id=run.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_the_primary_key_index_comes_back_when_the_migration_is_reversed(postgres):
    from django.core.management import call_command

    call_command("migrate", "runs", "0014", verbosity=0)
    try:
        assert any("_pkey" in d and "(id)" in d for d in _points_indexes())
        with connection.cursor() as cursor:  # a key named otherwise (docs/deploy.md's partitioning) goes too
            cursor.execute("ALTER TABLE runs_metricpoint RENAME CONSTRAINT runs_metricpoint_pkey TO points_part_pkey")
    finally:
        call_command("migrate", "runs", verbosity=0)
    assert len(_points_indexes()) == 1
