"""Where this process stands under ``torchrun`` and the collective the SDK runs over its process group.

``ranks_from_environment`` reads ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``;
``process_group_ranks`` asks the initialised default process group;
``broadcast`` gives rank 0's value to every rank. One Run for every rank
(``mado_tracking.distributed``) and sharded checkpoints
(``mado_tracking.dcp``) both build on this module; it imports no SDK module
but ``errors``, and torch only when a function needs it.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass

from mado_tracking.errors import MadoError

ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


@dataclass(frozen=True)
class Ranks:
    """This process's place under torchrun: ``rank`` (0-based, global), ``local_rank`` and ``world_size``."""

    rank: int
    local_rank: int
    world_size: int


def ranks_from_environment(environ: Mapping[str, str] | None = None) -> Ranks | None:
    """``Ranks`` from ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``, or None when not distributed (unset, or world size 1).

    Raises ``ValueError`` naming the variables when they are only partly set,
    not integers, or inconsistent (``0 <= RANK < WORLD_SIZE``).
    """
    environ = os.environ if environ is None else environ
    values = {name: environ.get(name, "").strip() for name in ENV_NAMES}
    if not any(values.values()):
        return None
    shown = ", ".join(f"{name}={value!r}" for name, value in values.items())
    try:
        rank, local_rank, world_size = (int(values[name]) for name in ENV_NAMES)
    except ValueError:
        raise ValueError(f"{', '.join(ENV_NAMES)} (set by torchrun) must all be integers, got {shown}") from None
    if world_size < 1 or not 0 <= rank < world_size or local_rank < 0:
        raise ValueError(f"{shown}: needs WORLD_SIZE >= 1, 0 <= RANK < WORLD_SIZE and LOCAL_RANK >= 0")
    return None if world_size == 1 else Ranks(rank, local_rank, world_size)


def process_group_ranks(ranks: Ranks | None = None):
    """``(rank, world_size)`` of the initialised default process group, else ``(0, 1)`` (a single process).

    Raises ``MadoError`` when ``ranks`` says this is a torchrun process but
    no process group was initialised (the ranks could not agree on anything).
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if ranks is not None:
        raise MadoError(
            f"rank {ranks.rank} of {ranks.world_size} (torchrun): call "
            "torch.distributed.init_process_group() before start_run, so every rank joins one Run"
        )
    return 0, 1


def broadcast(value, rank: int):
    """Rank 0's ``value`` on every rank of the default process group (pickled by torch, sent over it)."""
    import torch.distributed as dist

    box = [value if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
