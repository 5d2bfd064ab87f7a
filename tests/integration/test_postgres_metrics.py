"""Metric ingestion through PostgreSQL COPY, history reads and their statement timeout on a real PostgreSQL."""

import math

import pytest
from django.db import OperationalError, connection

from mado.db import read_statement_timeout
from mado.errors import ValidationFailed
from runs import selectors
from runs.metrics import metrics_ingest


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
