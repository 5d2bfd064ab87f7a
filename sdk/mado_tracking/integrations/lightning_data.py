"""A data order that resumes mid-epoch: ``ResumableSampler`` and ``ResumableDataLoader`` (docs/integrations.md,
"PyTorch Lightning"; docs/design/resume.md#exact-resume).

A shuffled ``torch.utils.data.DataLoader`` draws each epoch's order from the global torch RNG when the epoch
starts and keeps no record of how far it got, so a run resumed mid-epoch trains on other batches than the
uninterrupted run. ``ResumableSampler`` shuffles epoch ``e`` with its own generator seeded ``seed + e`` (the
order depends on nothing else) and can start a pass part-way; ``ResumableDataLoader`` counts the batches it
handed out and has ``state_dict()`` / ``load_state_dict()``, which Lightning's fit loop saves in its checkpoint
and restores before it iterates again (loaders with that pair are what Lightning treats as stateful).

Pure torch: usable in a plain loop as well (``loader.state_dict()`` into your checkpoint,
``loader.load_state_dict(state)`` before iterating).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Sampler

STATE_VERSION = 1


class ResumableSampler(Sampler[int]):
    """Indices ``0 .. length-1``, shuffled per epoch with ``torch.Generator().manual_seed(seed + epoch)`` (or in
    order with ``shuffle=False``), a pass able to start at a position.

    ``data_source``: a sized dataset or the number of samples (int >= 0). ``set_epoch(e)`` chooses the order
    (Lightning calls it at each epoch start); ``resume(epoch, position)`` makes the next pass over ``epoch``
    skip its first ``position`` indices. ``state_dict()`` counts the indices handed out by the current pass,
    which equals what training consumed only without worker prefetching (``num_workers=0``);
    ``ResumableDataLoader`` counts consumed batches instead.

    Raises ``ValueError`` (naming the argument) for a negative length or a seed that is not an int.
    """

    def __init__(self, data_source, *, shuffle: bool = True, seed: int = 0):
        length = data_source if isinstance(data_source, int) and not isinstance(data_source, bool) else None
        if length is None:
            try:
                length = len(data_source)
            except TypeError:
                raise ValueError(
                    f"data_source must be a sized dataset or a number of samples, got {type(data_source).__name__}"
                ) from None
        if length < 0:
            raise ValueError(f"data_source: the number of samples must be >= 0, got {length}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.length, self.shuffle, self.seed = length, bool(shuffle), seed
        self.epoch = 0
        self.position = 0  # indices handed out by the current pass
        self._start: tuple[int, int] | None = None  # (epoch, position) the next pass of that epoch starts at

    def __len__(self) -> int:
        return self.length

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next pass yields."""
        self.epoch = int(epoch)

    def order(self, epoch: int) -> list[int]:
        """Every index of ``epoch``'s pass, in order (the same for the same ``seed``, ``epoch`` and length)."""
        if not self.shuffle:
            return list(range(self.length))
        generator = torch.Generator()
        generator.manual_seed(self.seed + epoch)
        return torch.randperm(self.length, generator=generator).tolist()

    def resume(self, epoch: int, position: int) -> None:
        """Make the next pass over ``epoch`` start at ``position`` (indices into its order; 0 = from the start)."""
        self.epoch = int(epoch)
        self._start = (self.epoch, int(position))

    def __iter__(self) -> Iterator[int]:
        start = self._start[1] if self._start is not None and self._start[0] == self.epoch else 0
        self._start = None
        order = self.order(self.epoch)
        self.position = start
        for index in order[start:]:
            self.position += 1
            yield index

    def state_dict(self) -> dict:
        """``{"version", "epoch", "position", "seed", "shuffle", "length"}``: plain ints and bools."""
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "length": self.length,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state_dict()``'s answer: the next pass continues that epoch after ``position``.

        Raises ``ValueError`` naming the field: not a dict, a missing or non-int field, or a seed, shuffle or
        length other than this sampler's (the data or its order changed: resuming would skip other samples).
        """
        epoch, position = _check_state(state, self, position_key="position", scale=1)
        self.resume(*_next_start(epoch, position, self.length))


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` over ``dataset`` whose order is a ``ResumableSampler`` and whose ``state_dict()`` records the
    batches training consumed in the current epoch; Lightning saves it with each checkpoint and hands it back
    to ``load_state_dict`` on ``fit(ckpt_path=...)``, so the resumed epoch goes on with the next batch.

    ``shuffle`` and ``seed``: the sampler's. Every other keyword goes to ``DataLoader`` (``num_workers``,
    ``collate_fn``, ``drop_last``, …) except ``sampler`` and ``batch_sampler``, which it chooses itself
    (``ValueError``). Batches are counted as they are handed to the consumer, so worker prefetching does not
    move the recorded position.
    """

    def __init__(self, dataset, batch_size: int = 1, *, shuffle: bool = True, seed: int = 0, **kwargs):
        for name in ("sampler", "batch_sampler"):
            if kwargs.get(name) is not None:
                raise ValueError(f"{name}: ResumableDataLoader chooses its own (a ResumableSampler); leave it out")
            kwargs.pop(name, None)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        super().__init__(
            dataset, batch_size=batch_size, sampler=ResumableSampler(dataset, shuffle=shuffle, seed=seed), **kwargs
        )
        self.batches = 0  # batches handed out by the current pass
        self._start: tuple[int, int] | None = None  # (epoch, batches) the next pass of that epoch starts after

    def __iter__(self):
        # The torch iterator is made now, not at the first batch: it draws its worker seed from the global RNG
        # here, as a DataLoader always does, so a run's RNG use does not move.
        return _CountingIterator(super().__iter__(), self)

    def state_dict(self) -> dict:
        """``{"version", "epoch", "batches", "seed", "shuffle", "length", "batch_size"}``: plain ints and bools."""
        sampler = self.sampler
        return {
            "version": STATE_VERSION,
            "epoch": sampler.epoch,
            "batches": self.batches,
            "seed": sampler.seed,
            "shuffle": sampler.shuffle,
            "length": sampler.length,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue after the batches ``state`` records (the next pass skips them without loading them).

        Raises ``ValueError`` naming the field: not a dict, a missing or non-int field, or a seed, shuffle,
        length or batch size other than this loader's.
        """
        epoch, batches = _check_state(state, self.sampler, position_key="batches", scale=self.batch_size)
        if state.get("batch_size") != self.batch_size:
            raise ValueError(
                f"batch_size: the saved loader had {state.get('batch_size')!r}, this one {self.batch_size}: "
                "the position in batches would point at other samples"
            )
        epoch, position = _next_start(epoch, batches * self.batch_size, self.sampler.length)
        self.sampler.resume(epoch, position)
        self._start = (epoch, position // self.batch_size)


class _CountingIterator:
    """The torch iterator of one pass, counting the batches it hands out into ``loader.batches``."""

    def __init__(self, inner, loader: ResumableDataLoader):
        self._inner, self._loader = inner, loader
        start = loader._start
        loader.batches = start[1] if start is not None and start[0] == loader.sampler.epoch else 0
        loader._start = None

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self._inner)
        self._loader.batches += 1
        return batch

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name):
        inner = self.__dict__.get("_inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)


def _check_state(state, sampler: ResumableSampler, *, position_key: str, scale: int) -> tuple[int, int]:
    """``(epoch, position)`` of a saved state after checking it matches ``sampler``; ``ValueError`` naming the field."""
    if not isinstance(state, dict):
        raise ValueError(f"state must be a dict (from state_dict()), got {type(state).__name__}")
    for key in ("epoch", position_key, "seed", "length"):
        value = state.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or (key != "seed" and value < 0):
            raise ValueError(f"{key}: must be an int >= 0 in the saved data position, got {value!r}")
    if state[position_key] * scale >= state["length"] + scale:
        raise ValueError(f"{position_key}: {state[position_key]} is past the end of an epoch of {state['length']}")
    for key, mine in (("seed", sampler.seed), ("shuffle", sampler.shuffle), ("length", sampler.length)):
        if state.get(key) != mine:
            raise ValueError(
                f"{key}: the saved data position is for {key} {state.get(key)!r}, this loader has {mine!r}: "
                "the data or its order changed, so resuming there would skip other samples"
            )
    return state["epoch"], state[position_key]


def _next_start(epoch: int, position: int, length: int) -> tuple[int, int]:
    """Where the next pass starts: after ``position`` in ``epoch``, or at the next epoch's start when it was done."""
    return (epoch + 1, 0) if position >= length else (epoch, position)
