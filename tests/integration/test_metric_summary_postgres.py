"""The metric summary on PostgreSQL equals a full recomputation after any randomised program of writes (rows and
columns, binary COPY), retried batches, resumes that drop steps below the floor, and deleted Runs; two copies of one
batch sent at once store it once (docs/design/resume.md#steps-continue; docs/design/runs.md#resume-modes)."""

import itertools

import pytest
from hypothesis import HealthCheck, given, settings

from runs.metrics import metrics_ingest
from runs.models import MetricPoint
from tests.integration.concurrency import together
from tests.runs.metric_helpers import PROGRAM, play, recomputed, stored

NAMES = itertools.count()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=PROGRAM)
def test_the_summary_equals_a_recomputation_after_any_program(program, postgres, project, creator):
    play(program, actor=creator, project=project, name=f"pg{next(NAMES)}")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(3))
def test_two_copies_of_one_batch_at_once_store_it_once(postgres, run, creator, attempt):
    batch = {
        "actor": creator,
        "run": run,
        "columns": {"keys": ["loss"] * 500, "steps": list(range(500)), "values": [0.5] * 500},
        "idempotency_key": "retry-1",
    }
    outcomes = together((metrics_ingest, batch), (metrics_ingest, batch))
    assert [error for _, error in outcomes] == [None, None]
    assert sorted(result.replayed for result, _ in outcomes) == [False, True]
    assert MetricPoint.objects.filter(run=run).count() == 500
    assert stored(run.pk) == recomputed(run.pk) and stored(run.pk)["loss"][0] == 500
