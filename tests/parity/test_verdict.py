"""The parity verdict of a resumed Run, kept current by the metrics ingest (docs/design/resume.md#parity): identical,
within tolerance, diverged at a step naming the key and both values, unknown; batches of either Run in any order,
the parent still logging; a tolerance change; and a cost that follows the overlap, not the Runs' size."""

import random

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from parity import points as parity_points
from parity.models import BLOCK_STEPS, Parity, ParityBlock
from parity.services import parity_recompute, parity_tolerance_set
from runs import hooks
from tests.parity.conftest import CHECKPOINT_STEP, KEYS, curve

pytestmark = pytest.mark.django_db


def verdict_of(run) -> Parity:
    return Parity.objects.get(run=run)


def test_a_resume_that_logs_what_the_parent_logged_is_identical_over_the_overlap(log, parent, child):
    log(parent, range(27))  # failed at step 27 after its checkpoint at 20
    log(child, range(20, 40))
    parity = verdict_of(child)
    assert (parity.verdict, parity.step, parity.key) == ("identical", None, "")
    assert (parity.first_step, parity.last_step, parity.compared_steps) == (20, 26, 7)
    assert (parity.compared_keys, parity.compared_points, parity.max_difference) == (list(KEYS), 14, 0.0)
    assert (parity.checkpoint_step, parity.parent_id, parity.first_step_below_checkpoint) == (20, parent.pk, None)


def test_values_that_differ_by_less_than_the_tolerance_are_within_it(log, parent, child):
    log(parent, range(27))
    log(child, range(20, 30), value=lambda key, step: curve(key, step) * (1 + 3e-9))
    parity = verdict_of(child)
    assert (parity.verdict, parity.tolerance) == ("within_tolerance", 1e-6)
    assert 2e-9 < parity.max_difference < 4e-9


def test_the_first_step_beyond_the_tolerance_is_named_with_its_key_and_both_values(log, parent, child):
    log(parent, range(27))

    def drifting(key, step):
        return curve(key, step) + (0.25 if step >= 23 else 0.0)  # both keys part at 23: the first by name is named

    log(child, range(20, 30), value=drifting)
    parity = verdict_of(child)
    assert (parity.verdict, parity.step, parity.key) == ("diverged", 23, "train.accuracy")
    assert (parity.parent_value, parity.child_value) == (
        curve("train.accuracy", 23),
        curve("train.accuracy", 23) + 0.25,
    )
    assert parity.compared_steps == 7  # the comparison goes on past the divergence


def test_a_nan_against_a_number_diverges_and_nan_against_nan_is_identical(log, parent, child):
    log(parent, range(27), value=lambda key, step: float("nan") if key == "train.loss" else curve(key, step))
    log(child, range(20, 24), value=lambda key, step: float("nan") if key == "train.loss" else curve(key, step))
    assert verdict_of(child).verdict == "identical"
    log(child, [24], keys=["train.loss"], value=lambda key, step: 0.5)
    parity = verdict_of(child)
    assert (parity.verdict, parity.step, parity.key, parity.parent_value, parity.child_value) == (
        "diverged",
        24,
        "train.loss",
        None,  # NaN
        0.5,
    )


def test_a_parent_that_failed_right_after_its_checkpoint_leaves_the_verdict_unknown(log, parent, child):
    log(parent, range(20))  # steps 0..19: nothing after the checkpoint at 20
    log(child, range(20, 40))
    parity = verdict_of(child)
    assert (parity.verdict, parity.compared_steps, parity.first_step, parity.compared_keys) == ("unknown", 0, None, [])


def test_keys_only_one_run_logged_are_not_compared(log, parent, child):
    log(parent, range(27), keys=["train.loss", "parent.only"])
    log(child, range(20, 30), keys=["train.loss", "child.only"])
    assert verdict_of(child).compared_keys == ["train.loss"]


def test_a_child_that_starts_at_step_0_is_flagged_and_diverges_where_its_curve_leaves_the_parents(log, parent, child):
    log(parent, range(27))
    log(child, range(0, 30), value=lambda key, step: curve(key, step - 20 if step >= 20 else step))
    parity = verdict_of(child)
    assert parity.first_step_below_checkpoint == 0
    assert (parity.verdict, parity.step, parity.key) == ("diverged", 20, "train.accuracy")


def test_batches_in_any_order_end_on_the_verdict_of_the_whole_both_runs_logged(log, parent, child):
    """The parent still logging (a continue from a running Run): its batches and the child's interleave in a
    shuffled order, a step is logged twice (the value stored last counts); after every batch the verdict equals
    a comparison of everything stored so far."""
    batches = [(parent, range(start, start + 5)) for start in range(0, 40, 5)]
    batches += [(child, range(start, start + 3)) for start in range(20, 44, 3)]
    random.Random(29).shuffle(batches)
    batches.append((parent, [31]))  # logged again: its value now differs from the child's
    for run, steps in batches:
        value = (lambda key, step: curve(key, step) + 1.0) if list(steps) == [31] else curve
        log(run, steps, value=value)
        stored = verdict_of(child)
        fresh = Parity.objects.get(pk=stored.pk)
        ParityBlock.objects.filter(parity=fresh).delete()
        parity_recompute(parity_id=fresh.pk)
        fresh.refresh_from_db()
        fields = ("verdict", "step", "key", "compared_steps", "compared_points", "first_step", "last_step")
        assert [getattr(stored, f) for f in fields] == [getattr(fresh, f) for f in fields]
    final = verdict_of(child)
    assert (final.verdict, final.step, final.key, final.first_step, final.last_step) == (
        "diverged",
        31,
        "train.accuracy",
        20,
        39,
    )


def test_a_changed_tolerance_compares_every_verdict_of_the_project_again(log, parent, child, admin, project):
    log(parent, range(27))
    log(child, range(20, 30), value=lambda key, step: curve(key, step) * (1 + 1e-4))
    assert verdict_of(child).verdict == "diverged"
    parity_tolerance_set(actor=admin, project=project, tolerance=1e-3)
    parity = verdict_of(child)
    assert (parity.verdict, parity.tolerance, parity.step) == ("within_tolerance", 1e-3, None)


def test_a_changed_verdict_is_announced_once_it_commits(log, parent, child):
    heard = []

    def receiver(sender, *, parity, previous, **kwargs):
        heard.append((parity.run_id, previous, parity.verdict, parity.step))

    hooks.parity_changed.connect(receiver)
    try:
        log(parent, range(27))
        log(child, range(20, 23))
        log(child, range(23, 25))  # still identical: nothing to announce
        log(child, [25], value=lambda key, step: 9.0)
    finally:
        hooks.parity_changed.disconnect(receiver)
    assert heard == [(child.pk, "unknown", "identical", None), (child.pk, "identical", "diverged", 25)]


def test_a_batch_past_the_overlap_costs_one_query_and_one_inside_reads_only_its_blocks(log, parent, child, monkeypatch):
    """A parent of 50,000 steps that failed 10 steps after its checkpoint: the child's batches read only the
    blocks they reach of the overlap, and a batch past it reads nothing."""
    from checkpoints.models import Checkpoint

    Checkpoint.objects.filter(run=parent).update(step=49_990)
    for start in range(0, 50_000, 10_000):
        log(parent, range(start, start + 10_000), keys=["train.loss"])
    read = []
    real = parity_points.latest_values

    def counting(**kwargs):
        found = real(**kwargs)
        read.append(sum(len(steps) for steps, _values in found.values()))
        return found

    monkeypatch.setattr("parity.services.verdict.latest_values", counting)
    log(child, range(49_990, 50_005), keys=["train.loss"])
    assert verdict_of(child).verdict == "identical"
    assert sum(read) <= 2 * (10 + 2 * BLOCK_STEPS)
    read.clear()
    from parity.services.verdict import parity_after_batch

    child.refresh_from_db()
    with CaptureQueriesContext(connection) as queries:
        parity_after_batch(run=child, steps={"train.loss": (50_005, 50_100)})
    assert (len(queries), read) == (1, [])


def test_the_overlap_starts_at_the_checkpoints_step(log, parent, child):
    log(parent, range(27))
    log(
        child,
        range(CHECKPOINT_STEP - 5, 27),
        value=lambda key, step: 7.0 if step < CHECKPOINT_STEP else curve(key, step),
    )
    parity = verdict_of(child)
    assert (parity.verdict, parity.first_step, parity.first_step_below_checkpoint) == ("identical", 20, 15)


def test_system_metrics_are_never_compared_nor_taken_for_an_ignored_checkpoint(log, parent, child, login, creator):
    """The SDK samples the machine at the step training logged last: 0 before a resumed Run's first log."""
    from django.urls import reverse

    log(parent, range(27))
    log(parent, range(20, 27), keys=["system/cpu_percent"], value=lambda key, step: 12.5)
    log(child, [0], keys=["system/cpu_percent"], value=lambda key, step: 80.0)
    assert not Parity.objects.filter(run=child).exists()  # a batch of system metrics alone costs nothing
    log(child, range(20, 30))
    log(child, range(20, 27), keys=["system/cpu_percent"], value=lambda key, step: 99.0)
    parity = verdict_of(child)
    assert (parity.verdict, parity.compared_keys, parity.first_step_below_checkpoint) == ("identical", list(KEYS), None)
    page = login(creator).get(reverse("runs:run-detail", args=[child.pk])).content.decode()
    assert "ignored-checkpoint" not in page
