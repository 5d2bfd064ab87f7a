"""The metric summary on PostgreSQL equals a full recomputation after any randomised program of writes (rows and
columns, binary COPY), retried batches, resumes that drop steps below the floor, and deleted Runs (SPEC F2, F24)."""

import itertools

from hypothesis import HealthCheck, given, settings

from tests.runs.metric_helpers import PROGRAM, play

NAMES = itertools.count()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=PROGRAM)
def test_the_summary_equals_a_recomputation_after_any_program(program, postgres, project, creator):
    play(program, actor=creator, project=project, name=f"pg{next(NAMES)}")
