"""Two runs' curves compared on the steps both logged, as ``mado probe-resume`` reads them
(docs/design/checkpoints.md#probe)."""

import math

import pytest

from mado_tracking.parity import compare, describe

PARENT = {"train.loss": {19: 9.0, 20: 1.0, 21: 0.5, 22: 0.25}, "train.accuracy": {20: 0.5, 21: 0.6, 22: 0.7}}


def test_identical_curves_from_the_checkpoint_on():
    child = {"train.loss": {20: 1.0, 21: 0.5, 22: 0.25, 23: 0.1}, "train.accuracy": {20: 0.5, 21: 0.6, 22: 0.7}}
    found = compare(PARENT, child, from_step=20)
    assert (found["verdict"], found["compared_steps"]) == ("identical", 3)
    assert found["compared_keys"] == ["train.accuracy", "train.loss"]
    assert describe(found) == "identical (3 steps, 2 keys)"


def test_the_first_step_where_any_key_parts_is_named_with_both_values():
    child = {"train.loss": {20: 1.0, 21: 0.5, 22: 0.3}, "train.accuracy": {20: 0.5, 21: 0.61, 22: 0.7}}
    found = compare(PARENT, child, from_step=20)
    assert (found["verdict"], found["step"], found["key"]) == ("diverged", 21, "train.accuracy")
    assert (found["parent_value"], found["child_value"]) == (0.6, 0.61)
    assert describe(found, "a", "b") == "diverged at step 21: train.accuracy 0.6 (a) vs 0.61 (b)"


def test_a_relative_difference_below_the_tolerance_is_within_tolerance():
    child = {"train.loss": {20: 1.0 + 1e-9, 21: 0.5, 22: 0.25}}
    assert compare(PARENT, child, from_step=20)["verdict"] == "within_tolerance"
    assert compare(PARENT, child, from_step=20, tolerance=0)["verdict"] == "diverged"


def test_no_overlap_nan_system_keys_and_bad_values():
    assert compare(PARENT, {"train.loss": {30: 1.0}}, from_step=20)["verdict"] == "unknown"
    assert compare({"x": {1: None}}, {"x": {1: math.nan}}, from_step=0)["verdict"] == "identical"
    assert compare({"system/cpu": {1: 1.0}}, {"system/cpu": {1: 2.0}}, from_step=0)["verdict"] == "unknown"
    assert compare({"x": {1: 1.0}}, {"x": {1: "1.0x"}}, from_step=0)["verdict"] == "diverged"
    with pytest.raises(ValueError, match="tolerance must be a number >= 0"):
        compare(PARENT, PARENT, from_step=0, tolerance=-1)
    assert describe(None) == "no verdict"
