"""The parity verdict under batches committed at the same instant on a real PostgreSQL
(docs/design/resume.md#parity; docs/design/house.md#idempotent).

A parent still logging (a continue from a running Run) and its child send batches over the same blocks at once,
and a step is logged again meanwhile: after every round the stored verdict equals a comparison of everything stored,
whatever order the commits and their after-commit refreshes ran in. Two first batches of a child at once make one
verdict row.
"""

import random

import pytest

from parity.models import Parity, ParityBlock
from parity.services import parity_recompute
from runs.metrics import metrics_ingest
from tests.integration.concurrency import together
from tests.parity.conftest import KEYS, child, curve, parent, source_checkpoint  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
FIELDS = ("verdict", "step", "key", "compared_steps", "compared_points", "first_step", "last_step", "max_difference")


def batch(run, steps, value=curve):
    columns = {"keys": [], "steps": [], "values": []}
    for step in steps:
        for key in KEYS:
            columns["keys"].append(key)
            columns["steps"].append(step)
            columns["values"].append(value(key, step))
    return metrics_ingest, {"actor": run.created_by, "run": run, "columns": columns}


def recomputed(parity: Parity) -> list:
    """The verdict's fields compared from scratch (a copy of the blocks is left untouched)."""
    stored = [getattr(parity, field) for field in FIELDS]
    ParityBlock.objects.filter(parity=parity).delete()
    parity_recompute(parity_id=parity.pk)
    parity.refresh_from_db()
    fresh = [getattr(parity, field) for field in FIELDS]
    return stored, fresh


@pytest.mark.parametrize("seed", range(3))
def test_parent_and_child_batches_at_once_leave_the_verdict_of_everything_stored(postgres, parent, child, seed):
    rng = random.Random(seed)
    metrics_ingest(**batch(parent, range(20))[1])
    parted = rng.randrange(30, 200)  # the child's value parts from the parent's there, from the round that logs it
    for first in range(20, 212, 12):
        steps = list(range(first, first + 12))
        again = rng.randrange(20, first + 12)  # the parent logs an earlier step again: the value stored last counts

        def child_value(key, step, parted=parted):
            return curve(key, step) + (1.0 if step == parted else 0.0)

        outcomes = together(
            batch(parent, steps),
            batch(child, rng.sample(steps, len(steps)), value=child_value),
            batch(parent, [again]),
        )
        assert all(error is None for _result, error in outcomes), outcomes
        stored, fresh = recomputed(Parity.objects.get(run=child))
        assert stored == fresh, (first, again)
    final = Parity.objects.get(run=child)
    assert (final.verdict, final.step, final.key, final.first_step, final.last_step) == (
        "diverged",
        parted,
        "train.accuracy",
        20,
        211,
    )


def test_two_first_batches_of_a_child_at_once_make_one_verdict(postgres, parent, child):
    metrics_ingest(**batch(parent, range(40))[1])
    outcomes = together(batch(child, range(20, 30)), batch(child, range(30, 40)))
    assert all(error is None for _result, error in outcomes), outcomes
    parity = Parity.objects.get(run=child)
    assert (parity.verdict, parity.first_step, parity.last_step, parity.compared_steps) == ("identical", 20, 39, 20)
    assert parity.child_first_step == 20
