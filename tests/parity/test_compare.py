"""The comparison rules themselves (docs/design/resume.md#parity): bit-for-bit identity, the relative difference,
blocks of 64 steps and their masks, and how blocks fold into one verdict."""

import math
import random

import numpy as np
import pytest

from parity.compare import (
    Cell,
    compare_cells,
    relative_difference,
    same_float,
    signed_mask,
    summarize,
    unsigned_mask,
)

NAN = math.nan
INF = math.inf


@pytest.mark.parametrize(
    "parent, child, same, difference",
    [
        (0.1, 0.1, True, 0.0),
        (NAN, NAN, True, 0.0),
        (INF, INF, True, 0.0),
        (0.0, -0.0, False, 0.0),  # equal numbers, other bits: within any tolerance, not identical
        (1.0, 1.0 + 2**-52, False, 2**-52 / (1.0 + 2**-52)),
        (NAN, 1.0, False, INF),
        (INF, -INF, False, INF),
        (INF, 1e308, False, INF),
        (-2.0, 2.0, False, 2.0),
    ],
)
def test_sameness_and_relative_difference(parent, child, same, difference):
    assert same_float(parent, child) is same
    assert relative_difference(parent, child) == difference


def series(steps, values) -> tuple:
    return np.array(list(steps), dtype=np.int64), np.array(list(values), dtype=np.float64)


def test_cells_cut_each_key_into_blocks_of_64_steps_and_name_the_first_step_beyond_the_tolerance():
    parent = {"loss": series(range(60, 140), range(60, 140))}
    child = {"loss": series(range(62, 200), (s + (0.5 if s in (70, 130) else 0.0) for s in range(62, 200)))}
    cells = compare_cells(parent, child, tolerance=1e-6)
    assert [(c.block, c.compared, c.first_step, c.last_step, c.diverged_step) for c in cells] == [
        (0, 2, 62, 63, None),
        (1, 64, 64, 127, 70),
        (2, 12, 128, 139, 130),
    ]
    assert cells[0].mask == 0b11 << 62 and cells[1].mask == 2**64 - 1
    assert unsigned_mask(signed_mask(cells[1].mask)) == cells[1].mask and signed_mask(cells[1].mask) == -1


def cell(key, step, *, identical=True, diverged=None, difference=0.0):
    block = step // 64
    return Cell(key, block, 1 << (step % 64), 1, identical, step, step, diverged, 1.0, 2.0, difference)


def test_the_verdict_folds_every_block():
    assert summarize([]).verdict == "unknown"
    same = [cell("a", 20), cell("b", 20), cell("a", 21)]
    folded = summarize(same)
    assert (folded.verdict, folded.compared_steps, folded.compared_points, folded.compared_keys) == (
        "identical",
        2,
        3,
        ["a", "b"],
    )
    close = summarize([*same, cell("b", 90, identical=False, difference=1e-9)])
    assert (close.verdict, close.last_step, close.max_difference) == ("within_tolerance", 90, 1e-9)
    parted = summarize([*same, cell("b", 90, diverged=90), cell("a", 90, diverged=90), cell("c", 95, diverged=95)])
    assert (parted.verdict, parted.step, parted.key) == ("diverged", 90, "a")


def test_whole_columns_follow_the_rule_for_one_pair():
    """The vector comparison agrees, cell by cell, with ``same_float`` and ``relative_difference`` applied to each
    pair, on values chosen to hit the edges: NaN, infinities, signed zeros, neighbours one ulp apart."""
    rng = random.Random(7)
    pool = [NAN, INF, -INF, 0.0, -0.0, 1.0, 1.0 + 2**-52, -1.0, 1e-300, 2.5, 2.5 * (1 + 1e-7), 1e308]
    steps = sorted(rng.sample(range(1000), 400))
    before = [rng.choice(pool) for _ in steps]
    after = [value if rng.random() < 0.5 else rng.choice(pool) for value in before]
    tolerance = 1e-6
    cells = compare_cells(
        {"k": series(steps, before)}, {"k": series(steps, after), "other": series([1], [1.0])}, tolerance=tolerance
    )
    expected = {}
    for step, p, c in zip(steps, before, after):
        block = expected.setdefault(step // 64, {"same": True, "worst": 0.0, "diverged": None, "count": 0})
        difference = relative_difference(p, c)
        block["same"] = block["same"] and same_float(p, c)
        block["worst"] = max(block["worst"], difference)
        block["count"] += 1
        if block["diverged"] is None and difference > tolerance:
            block["diverged"] = step
    got = {cell.block: cell for cell in cells}
    assert sorted(got) == sorted(expected)
    for number, block in expected.items():
        cell = got[number]
        assert (cell.identical, cell.max_difference, cell.diverged_step, cell.compared) == (
            block["same"],
            block["worst"],
            block["diverged"],
            block["count"],
        ), number
