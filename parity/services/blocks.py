"""The ``ParityBlock`` rows a verdict is folded from, for a resumed Run's ``Parity`` (docs/design/resume.md#parity)
and for a resume segment (docs/design/resume.md#same-run-parity) alike.

A verdict's owner is named as ``{"parity": parity}`` or ``{"segment": segment}``: the block rows it stores and
folds are that row's. Callers hold the owner's row lock, so two batches never store one owner's blocks at once.
"""

import math

from parity.compare import Cell, signed_mask, summarize
from parity.models import BLOCK_STEPS, ParityBlock

CELL_FIELDS = [
    "mask",
    "compared",
    "identical",
    "first_step",
    "last_step",
    "diverged_step",
    "parent_value",
    "child_value",
    "max_difference",
]


def block_span(low: int, high: int) -> tuple[int, int]:
    """The steps of the blocks that hold steps ``low`` to ``high``: the range to read to compare them whole."""
    return low // BLOCK_STEPS * BLOCK_STEPS, (high // BLOCK_STEPS + 1) * BLOCK_STEPS - 1


def nan_as_none(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def blocks_store(*, owner: dict, cells: list[Cell]) -> None:
    """Write ``cells`` as ``owner``'s blocks, replacing the rows of the same (key, block): one upsert."""
    if not cells:
        return
    rows = [
        ParityBlock(
            **owner,
            key=cell.key,
            block=cell.block,
            mask=signed_mask(cell.mask),
            compared=cell.compared,
            identical=cell.identical,
            first_step=cell.first_step,
            last_step=cell.last_step,
            diverged_step=cell.diverged_step,
            parent_value=nan_as_none(cell.parent_value),
            child_value=nan_as_none(cell.child_value),
            max_difference=cell.max_difference,
        )
        for cell in cells
    ]
    (name,) = owner
    ParityBlock.objects.bulk_create(
        rows, update_conflicts=True, unique_fields=[name, "key", "block"], update_fields=CELL_FIELDS
    )


def blocks_fold(*, owner: dict) -> dict:
    """The verdict's fields (``parity.compare.Summary``'s, NaN values as None) folded from every block of
    ``owner``: one query over its blocks."""
    stored = ParityBlock.objects.filter(**owner).values_list("key", "block", *CELL_FIELDS)
    fields = summarize(Cell(*row) for row in stored)._asdict()
    fields["parent_value"] = nan_as_none(fields["parent_value"])
    fields["child_value"] = nan_as_none(fields["child_value"])
    return fields
