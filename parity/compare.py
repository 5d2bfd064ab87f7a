"""Comparing a resumed Run's metric values with its parent's, block by block (docs/design/resume.md#parity).

Pure functions, no database: the points of both Runs come in as ``{(key, step): value}`` (the value stored last at
that key and step; NaN as NaN), the result is one ``Cell`` per key and block of ``BLOCK_STEPS`` steps holding at
least one step both logged, and ``summarize`` folds the cells of a verdict into its fields.
"""

import math
import struct
from collections.abc import Iterable, Mapping
from typing import NamedTuple

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


def compare_cells(
    parent: Mapping[tuple[str, int], float], child: Mapping[tuple[str, int], float], *, tolerance: float
) -> list[Cell]:
    """One ``Cell`` per (key, block) where ``parent`` and ``child`` share a (key, step), in (key, block) order.

    A pair is within the tolerance when ``relative_difference <= tolerance``;
    a block's ``diverged_step`` is its lowest step beyond it.
    """
    shared = sorted(parent.keys() & child.keys())
    cells = []
    index = 0
    while index < len(shared):
        key, step = shared[index]
        block = step // BLOCK_STEPS
        mask = compared = 0
        identical = True
        first = step
        last = step
        diverged = parent_value = child_value = None
        worst = 0.0
        while index < len(shared) and shared[index][0] == key and shared[index][1] // BLOCK_STEPS == block:
            step = shared[index][1]
            before, after = parent[key, step], child[key, step]
            difference = relative_difference(before, after)
            if difference > worst:
                worst = difference
            if identical and not same_float(before, after):
                identical = False
            if diverged is None and difference > tolerance:
                diverged, parent_value, child_value = step, before, after
            mask |= 1 << (step - block * BLOCK_STEPS)
            compared += 1
            last = step
            index += 1
        cells.append(
            Cell(key, block, mask, compared, identical, first, last, diverged, parent_value, child_value, worst)
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
