"""The metrics write and read paths on a points table range-partitioned by run id (docs/deploy.md, "Partitioning").

The test swaps ``runs_metricpoint`` for a declaratively partitioned table of
the same columns inside its transaction (rolled back afterwards), as the
migration path in docs/deploy.md does for good, then ingests through binary
``COPY``, reads keys, counts, pages and a downsampled series through the API,
resumes the Run by id, and checks that a history read touches only the Run's
partition.
"""

import json

import pytest
from django.db import connection

from runs.metrics import metrics_ingest
from runs.models import MetricPoint, Run
from runs.resume import run_start

TABLE = MetricPoint._meta.db_table


def partition_points_table(split_at: int) -> None:
    """``TABLE`` becomes a table partitioned by ``run_id``: [MINVALUE, split_at) and [split_at, MAXVALUE)."""
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {TABLE}_plain")
        cursor.execute(f"""
            CREATE SEQUENCE {TABLE}_part_id_seq;
            CREATE TABLE {TABLE} (
                id bigint NOT NULL DEFAULT nextval('{TABLE}_part_id_seq'),
                run_id bigint NOT NULL, key varchar(250) NOT NULL, step bigint NOT NULL CHECK (step >= 0),
                value double precision, timestamp bigint NOT NULL
            ) PARTITION BY RANGE (run_id);
            CREATE INDEX {TABLE}_part_history ON {TABLE} (run_id, key, step, id);
            CREATE TABLE {TABLE}_low PARTITION OF {TABLE} FOR VALUES FROM (MINVALUE) TO ({split_at});
            CREATE TABLE {TABLE}_high PARTITION OF {TABLE} FOR VALUES FROM ({split_at}) TO (MAXVALUE);
        """)


@pytest.fixture
def partitioned(postgres, project, creator):
    old = run_start(actor=creator, project=project, external_id="old-run", resume="allow", host="h", pid=1).run
    partition_points_table(split_at=old.pk + 1)
    return old


def test_write_and_read_paths_work_on_a_partitioned_points_table(partitioned, project, creator, client_as):
    new = run_start(actor=creator, project=project, external_id="new-run", resume="allow", host="h", pid=1).run
    for run in (partitioned, new):
        metrics_ingest(actor=creator, run=run, columns={
            "keys": ["loss"] * 3000 + ["acc"], "steps": list(range(3000)) + [7],
            "values": [1.0 / (s + 1) for s in range(3000)] + ["NaN"]})
        metrics_ingest(actor=creator, run=run, points=[{"key": "loss", "value": 9.0, "step": 3000}],
                       idempotency_key="once")
        metrics_ingest(actor=creator, run=run, points=[{"key": "loss", "value": 9.0, "step": 3000}],
                       idempotency_key="once")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT run_id, count(*) FROM {TABLE}_high GROUP BY run_id")
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


def test_a_history_read_scans_only_the_runs_partition(partitioned, creator):
    metrics_ingest(actor=creator, run=partitioned, points=[{"key": "loss", "value": 1.0, "step": 0}])
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a two-row table: ask whether the index can serve the order
        cursor.execute(f"EXPLAIN (FORMAT JSON) SELECT step, value FROM {TABLE} WHERE run_id = %s AND key = %s "
                       "ORDER BY step, id", [partitioned.pk, "loss"])
        plan = json.dumps(cursor.fetchone()[0])
    assert f"{TABLE}_low" in plan and f"{TABLE}_high" not in plan
    assert '"Sort"' not in plan  # the index gives (step, id) order
