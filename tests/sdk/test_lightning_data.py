"""``ResumableSampler`` / ``ResumableDataLoader``: an order fixed by seed and epoch, resumed after the batches
consumed, and saved states checked field by field (docs/design/resume.md#exact-resume)."""

import pytest
import torch
from torch.utils.data import TensorDataset

from mado_tracking.integrations.lightning import ResumableDataLoader, ResumableSampler

DATA = TensorDataset(torch.arange(10))


def _epoch(loader) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]


def test_the_order_depends_only_on_the_seed_and_the_epoch():
    sampler = ResumableSampler(DATA, seed=3)
    first = list(sampler)
    assert sorted(first) == list(range(10)) and list(ResumableSampler(10, seed=3)) == first
    sampler.set_epoch(1)
    assert list(sampler) != first and sorted(sampler) == list(range(10))
    assert list(ResumableSampler(10, shuffle=False)) == list(range(10))


def test_a_loader_resumed_mid_epoch_yields_the_batches_an_uninterrupted_pass_would(tmp_path):
    loader = ResumableDataLoader(DATA, batch_size=3, seed=1)
    uninterrupted = _epoch(loader)
    assert len(uninterrupted) == 4 and loader.state_dict()["batches"] == 4
    iterator = iter(loader)
    next(iterator), next(iterator)
    state = loader.state_dict()
    assert state == {
        "version": 1,
        "epoch": 0,
        "batches": 2,
        "seed": 1,
        "shuffle": True,
        "length": 10,
        "batch_size": 3,
    }
    torch.save(state, tmp_path / "state.pt")
    again = ResumableDataLoader(DATA, batch_size=3, seed=1)
    again.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert _epoch(again) == uninterrupted[2:]
    assert again.state_dict()["batches"] == 4  # counted on from the restored position
    assert _epoch(again) == uninterrupted  # the next pass of the same epoch is whole again


def test_a_state_saved_at_the_end_of_an_epoch_resumes_at_the_next_one():
    loader = ResumableDataLoader(DATA, batch_size=3, seed=1)
    _epoch(loader)
    loader.sampler.set_epoch(1)
    second = _epoch(loader)
    loader.sampler.set_epoch(0)
    _epoch(loader)
    again = ResumableDataLoader(DATA, batch_size=3, seed=1)
    again.load_state_dict(loader.state_dict())
    assert again.sampler.epoch == 1 and _epoch(again) == second


def test_a_sampler_resumes_after_the_indices_it_handed_out():
    sampler = ResumableSampler(10, seed=5)
    sampler.set_epoch(2)
    order = list(sampler)
    iterator = iter(sampler)
    [next(iterator) for _ in range(4)]
    again = ResumableSampler(10, seed=5)
    again.load_state_dict(sampler.state_dict())
    assert list(again) == order[4:]


GOOD = {"version": 1, "epoch": 0, "batches": 1, "seed": 1, "shuffle": True, "length": 10, "batch_size": 3}


@pytest.mark.parametrize(
    ("state", "field"),
    [
        (["not", "a", "dict"], "state must be a dict"),
        ({**GOOD, "epoch": None}, "epoch: must be an int >= 0"),
        ({**GOOD, "batches": -1}, "batches: must be an int >= 0"),
        ({**GOOD, "batches": True}, "batches: must be an int >= 0"),
        ({k: v for k, v in GOOD.items() if k != "length"}, "length: must be an int >= 0"),
        ({**GOOD, "batches": 5}, "batches: 5 is past the end of an epoch of 10"),
        ({**GOOD, "seed": 2}, "seed: the saved data position is for seed 2, this loader has 1"),
        ({**GOOD, "shuffle": False}, "shuffle: the saved data position is for shuffle False"),
        ({**GOOD, "length": 11}, "length: the saved data position is for length 11, this loader has 10"),
        ({**GOOD, "batch_size": 4}, "batch_size: the saved loader had 4, this one 3"),
    ],
)
def test_a_saved_state_that_does_not_fit_is_refused_naming_the_field(state, field):
    loader = ResumableDataLoader(DATA, batch_size=3, seed=1)
    with pytest.raises(ValueError) as refused:
        loader.load_state_dict(state)
    assert str(refused.value).startswith(field)
    assert _epoch(loader) == _epoch(ResumableDataLoader(DATA, batch_size=3, seed=1))  # nothing changed


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ResumableSampler(-1), "data_source: the number of samples must be >= 0"),
        (lambda: ResumableSampler(object()), "data_source must be a sized dataset or a number of samples"),
        (lambda: ResumableSampler(3, seed="0"), "seed must be an int"),
        (lambda: ResumableDataLoader(DATA, batch_size=0), "batch_size must be an int >= 1"),
        (lambda: ResumableDataLoader(DATA, sampler=[0, 1]), "sampler: ResumableDataLoader chooses its own"),
    ],
)
def test_bad_arguments_are_refused_naming_them(make, message):
    with pytest.raises(ValueError, match=message):
        make()
