"""Comparing a resumed Run's metric values with its parent's, block by block (docs/design/resume.md#parity).

Pure functions, no database: the points of both Runs come in per key as two columns, steps and values (the value
stored last at each step; NaN as NaN); the result is one ``Cell`` per key and block of ``BLOCK_STEPS`` steps holding
at least one step both logged, and ``summarize`` folds the cells of a verdict into its fields. ``relative_difference``
and ``same_float`` state the rule for one pair; ``compare_cells`` applies it to whole columns.
"""

import math
import struct
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import numpy as np

from parity.models import BLOCK_STEPS, ParityVerdict

_DOUBLE = struct.Struct("<d")
_SIGN = 1 << 63


class Cell(NamedTuple):
    """The comparison of one ``key`` over one block (a ``ParityBlock`` row's fields).

    ``mask`` bit ``i``: step ``block * BLOCK_STEPS + i`` was compared (as an
    unsigned int here; ``signed_mask`` for the column). ``diverged_step`` the
    first step whose relative difference exceeds the tolerance (None: none),
    with ``parent_value`` / ``child_value`` there (None otherwise).
    """

    key: str
    block: int
    mask: int
    compared: int
    identical: bool
    first_step: int
    last_step: int
    diverged_step: int | None
    parent_value: float | None
    child_value: float | None
    max_difference: float


def relative_difference(parent: float, child: float) -> float:
    """``|child - parent| / max(|parent|, |child|)``: 0.0 for equal values (NaN = NaN, 0.0 = -0.0, the same
    infinity), ``inf`` when exactly one is NaN or an infinity differs."""
    if parent == child or (parent != parent and child != child):
        return 0.0
    if not (math.isfinite(parent) and math.isfinite(child)):
        return math.inf
    return abs(child - parent) / max(abs(parent), abs(child))


def same_float(parent: float, child: float) -> bool:
    """Bit for bit the same float64 (any NaN equals any NaN; 0.0 and -0.0 differ)."""
    if parent != parent:
        return child != child
    return _DOUBLE.pack(parent) == _DOUBLE.pack(child)


def signed_mask(mask: int) -> int:
    """``mask`` (0 to 2**64 - 1) as the signed 64-bit integer a BIGINT column holds."""
    return mask - (1 << 64) if mask & _SIGN else mask


def unsigned_mask(mask: int) -> int:
    return mask & ((1 << 64) - 1)


Series = tuple[np.ndarray, np.ndarray]  # one key's steps (int64, increasing, distinct) and values (float64)


def compare_cells(parent: Mapping[str, Series], child: Mapping[str, Series], *, tolerance: float) -> list[Cell]:
    """One ``Cell`` per (key, block) where ``parent`` and ``child`` share a (key, step), in (key, block) order.

    Each maps a key to its ``Series``. A pair is within the tolerance when its
    relative difference (``relative_difference``) is at most ``tolerance``; a
    block's ``diverged_step`` is its lowest step beyond it. Whole columns at a
    time (numpy): the cost of a block is a few vector operations, not a
    Python loop per point.
    """
    cells = []
    for key in sorted(parent.keys() & child.keys()):
        (parent_steps, parent_values), (child_steps, child_values) = parent[key], child[key]
        steps, at_parent, at_child = np.intersect1d(parent_steps, child_steps, assume_unique=True, return_indices=True)
        if not len(steps):
            continue
        cells += _key_cells(key, steps, parent_values[at_parent], child_values[at_child], tolerance)
    return cells


def _key_cells(key: str, steps: np.ndarray, before: np.ndarray, after: np.ndarray, tolerance: float) -> list[Cell]:
    both_nan = np.isnan(before) & np.isnan(after)
    equal = (before == after) | both_nan
    identical = (before.view(np.int64) == after.view(np.int64)) | both_nan
    finite = np.isfinite(before) & np.isfinite(after)
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = np.abs(after - before) / np.maximum(np.abs(before), np.abs(after))
    difference = np.where(equal, 0.0, np.where(finite, relative, np.inf))
    blocks = steps // BLOCK_STEPS
    starts = np.flatnonzero(np.r_[True, blocks[1:] != blocks[:-1]])
    counts = np.diff(np.r_[starts, len(steps)])
    bits = np.left_shift(np.uint64(1), (steps - blocks * BLOCK_STEPS).astype(np.uint64))
    masks = np.bitwise_or.reduceat(bits, starts)
    same = np.logical_and.reduceat(identical, starts)
    worst = np.maximum.reduceat(difference, starts)
    beyond = np.flatnonzero(difference > tolerance)
    first_beyond = {}
    if len(beyond):
        owners = np.searchsorted(starts, beyond, side="right") - 1
        unique_owners, first = np.unique(owners, return_index=True)
        first_beyond = dict(zip(unique_owners.tolist(), beyond[first].tolist()))
    cells = []
    for index, (start, count) in enumerate(zip(starts.tolist(), counts.tolist())):
        at = first_beyond.get(index)
        cells.append(
            Cell(
                key,
                int(blocks[start]),
                int(masks[index]),
                count,
                bool(same[index]),
                int(steps[start]),
                int(steps[start + count - 1]),
                None if at is None else int(steps[at]),
                None if at is None else float(before[at]),
                None if at is None else float(after[at]),
                float(worst[index]),
            )
        )
    return cells


class Summary(NamedTuple):
    """A verdict's fields folded from its cells (``Parity``'s columns of the same names)."""

    verdict: str
    step: int | None
    key: str
    parent_value: float | None
    child_value: float | None
    compared_points: int
    compared_steps: int
    compared_keys: list[str]
    first_step: int | None
    last_step: int | None
    max_difference: float | None


def summarize(cells: Iterable[Cell]) -> Summary:
    """Fold every cell of one verdict (docs/design/resume.md#parity): ``unknown`` without a compared step;
    ``diverged`` at the lowest diverged step (the first key by name on a tie); else ``identical`` when every
    cell is, else ``within_tolerance``. ``compared_steps`` counts the distinct steps over all keys."""
    masks: dict[int, int] = {}
    keys = set()
    points = 0
    identical = True
    first = last = worst = None
    diverged = None
    for cell in cells:
        masks[cell.block] = masks.get(cell.block, 0) | unsigned_mask(cell.mask)
        keys.add(cell.key)
        points += cell.compared
        identical = identical and cell.identical
        first = cell.first_step if first is None else min(first, cell.first_step)
        last = cell.last_step if last is None else max(last, cell.last_step)
        worst = cell.max_difference if worst is None else max(worst, cell.max_difference)
        if cell.diverged_step is not None and (diverged is None or (cell.diverged_step, cell.key) < diverged[:2]):
            diverged = (cell.diverged_step, cell.key, cell.parent_value, cell.child_value)
    steps = sum(mask.bit_count() for mask in masks.values())
    if not points:
        verdict = ParityVerdict.UNKNOWN
    elif diverged is not None:
        verdict = ParityVerdict.DIVERGED
    elif identical:
        verdict = ParityVerdict.IDENTICAL
    else:
        verdict = ParityVerdict.WITHIN_TOLERANCE
    step, key, parent_value, child_value = diverged or (None, "", None, None)
    return Summary(str(verdict), step, key, parent_value, child_value, points, steps, sorted(keys), first, last, worst)
