"""The metrics write and read paths on a chunk table range-partitioned by run id (docs/deploy.md, "How points are
stored, and partitioning them").

The test swaps ``runs_metricchunk`` for a declaratively partitioned table of
the same columns inside its transaction (rolled back afterwards), as the
migration path in docs/deploy.md does for good (the points view dropped and
created again over it), then ingests through binary ``COPY``, reads keys,
counts, pages and a downsampled series through the API, resumes the Run by
id, and checks that a history page touches only the Run's partition.
"""

import json
from importlib import import_module

import pytest
from django.db import connection

from runs.history import _PG_PAGE
from runs.metrics import metrics_ingest
from runs.models import MetricChunk, MetricPoint, Run
from runs.resume import run_start

TABLE = MetricChunk._meta.db_table
VIEW = import_module("runs.migrations.0016_metric_chunks").POSTGRES_VIEW


def partition_chunk_table(split_at: int) -> None:
    """``TABLE`` becomes a table partitioned by ``run_id``: [MINVALUE, split_at) and [split_at, MAXVALUE)."""
    with connection.cursor() as cursor:
        cursor.execute(f"DROP VIEW {MetricPoint._meta.db_table}")
        cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {TABLE}_plain")
        cursor.execute(f"""
            CREATE SEQUENCE {TABLE}_part_id_seq;
            CREATE TABLE {TABLE} (
                id bigint NOT NULL DEFAULT nextval('{TABLE}_part_id_seq'),
                run_id bigint NOT NULL, key varchar(250) NOT NULL,
                first_step bigint NOT NULL CHECK (first_step >= 0),
                last_step bigint NOT NULL CHECK (last_step >= first_step),
                count integer NOT NULL CHECK (count > 0 AND count < 1048576),
                steps bigint[] NOT NULL, "values" double precision[] NOT NULL, timestamps bigint[] NOT NULL,
                PRIMARY KEY (run_id, id)
            ) PARTITION BY RANGE (run_id);
            CREATE INDEX {TABLE}_part_history ON {TABLE} (run_id, key, last_step, id) INCLUDE (first_step, count);
            CREATE TABLE {TABLE}_low PARTITION OF {TABLE} FOR VALUES FROM (MINVALUE) TO ({split_at});
            CREATE TABLE {TABLE}_high PARTITION OF {TABLE} FOR VALUES FROM ({split_at}) TO (MAXVALUE);
        """)
        cursor.execute(VIEW)


@pytest.fixture
def partitioned(postgres, project, creator):
    old = run_start(actor=creator, project=project, external_id="old-run", resume="allow", host="h", pid=1).run
    partition_chunk_table(split_at=old.pk + 1)
    return old


def test_write_and_read_paths_work_on_a_partitioned_chunk_table(partitioned, project, creator, client_as):
    new = run_start(actor=creator, project=project, external_id="new-run", resume="allow", host="h", pid=1).run
    for run in (partitioned, new):
        metrics_ingest(
            actor=creator,
            run=run,
            columns={
                "keys": ["loss"] * 3000 + ["acc"],
                "steps": list(range(3000)) + [7],
                "values": [1.0 / (s + 1) for s in range(3000)] + ["NaN"],
            },
        )
        metrics_ingest(
            actor=creator, run=run, points=[{"key": "loss", "value": 9.0, "step": 3000}], idempotency_key="once"
        )
        metrics_ingest(
            actor=creator, run=run, points=[{"key": "loss", "value": 9.0, "step": 3000}], idempotency_key="once"
        )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT run_id, sum(count) FROM {TABLE}_high GROUP BY run_id")
        assert cursor.fetchall() == [(new.pk, 3002)]

    client = client_as("viewer")
    url = f"/api/v1/runs/{new.pk}/metrics/"
    assert client.get(url).json() == {"keys": ["acc", "loss"]}
    page = client.get(url, {"key": "loss", "page": 2, "page_size": 1000}).json()
    assert page["count"] == 3001 and [p["step"] for p in page["results"]][:2] == [1000, 1001]
    series = client.get(url, {"key": "loss", "max_points": 100}).json()
    kept = series["results"]
    assert len(kept["steps"]) <= 100 and (3000, 9.0) in zip(kept["steps"], kept["values"])

    Run.objects.filter(pk=new.pk).update(status="failed")
    resumed = run_start(actor=creator, project=project, external_id="new-run", resume="allow", host="h", pid=2)
    assert resumed.last_step == 3000 and resumed.run.step_floor == 3001


def test_a_history_page_scans_only_the_runs_partition(partitioned, creator):
    metrics_ingest(actor=creator, run=partitioned, points=[{"key": "loss", "value": 1.0, "step": 0}])
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a one-row table: ask what the index can serve
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + _PG_PAGE,
            {"run": partitioned.pk, "key": "loss", "offset": 0, "limit": 1000, "end": 1000},
        )
        plan = json.dumps(cursor.fetchone()[0])
    assert f"{TABLE}_low" in plan and f"{TABLE}_high" not in plan
