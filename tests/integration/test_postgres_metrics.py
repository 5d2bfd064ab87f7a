"""Metric ingestion through PostgreSQL COPY and history reads on a real PostgreSQL (issue 2)."""

import math

import pytest

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
