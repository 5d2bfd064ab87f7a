"""``mado_tracking.torch``: a saved training state restores model, optimizer, scheduler and every RNG
(docs/design/interfaces.md#example-program)."""

import os
import random

import numpy as np
import pytest
import torch

from mado_tracking.torch import load_checkpoint, load_extra, save_checkpoint


def _setup(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler, torch.Generator().manual_seed(seed)


def _train(model, optimizer, scheduler, generator, steps: int) -> list[float]:
    """A few steps that consume every RNG: batches from the generator, dropout-like noise from the globals."""
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 4, generator=generator) + torch.rand(1) + random.random() + float(np.random.rand())
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return losses


def _draws(generator) -> tuple:
    return (
        random.random(),
        random.gauss(0, 1),
        float(np.random.rand()),
        float(np.random.randn()),
        torch.rand(3).tolist(),
        torch.rand(2, generator=generator).tolist(),
    )


def test_a_restored_run_continues_bit_for_bit(tmp_path):
    model, optimizer, scheduler, generator = _setup(0)
    _train(model, optimizer, scheduler, generator, 3)
    save_checkpoint(
        tmp_path / "ckpt",
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        step=3,
        extra={"epoch": 1, "best": torch.tensor([0.5])},
        generators={"batches": generator},
    )
    expected_losses = _train(model, optimizer, scheduler, generator, 4)
    expected_draws = _draws(generator)
    expected_weights = [p.detach().clone() for p in model.parameters()]

    random.seed(99)
    np.random.seed(99)
    model, optimizer, scheduler, generator = _setup(1)  # everything different until loaded
    step = load_checkpoint(
        tmp_path / "ckpt", model=model, optimizer=optimizer, scheduler=scheduler, generators={"batches": generator}
    )
    assert step == 3
    assert _train(model, optimizer, scheduler, generator, 4) == expected_losses
    assert _draws(generator) == expected_draws
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), expected_weights))
    extra = load_extra(tmp_path / "ckpt")
    assert extra["epoch"] == 1 and torch.equal(extra["best"], torch.tensor([0.5]))


def test_the_next_random_numbers_after_loading_match_those_after_saving(tmp_path):
    model, *_ = _setup(0)
    random.random(), np.random.rand(), torch.rand(1)
    save_checkpoint(tmp_path, model=model, step=0)
    after_save = _draws(torch.Generator())
    random.random(), np.random.rand(), torch.rand(5)
    load_checkpoint(tmp_path, model=model)
    assert _draws(torch.Generator()) == after_save


def test_a_later_save_without_optimizer_removes_the_stale_file_and_loading_one_is_refused(tmp_path):
    model, optimizer, _, _ = _setup(0)
    save_checkpoint(tmp_path, model=model, optimizer=optimizer, step=1)
    save_checkpoint(tmp_path, model=model, step=2)
    assert not (tmp_path / "optimizer.pt").exists()
    with pytest.raises(ValueError, match="no optimizer state"):
        load_checkpoint(tmp_path, model=model, optimizer=optimizer)
    assert load_checkpoint(tmp_path, model=model) == 2


def test_a_negative_step_is_refused(tmp_path):
    model, *_ = _setup(0)
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        save_checkpoint(tmp_path, model=model, step=-1)


def test_an_interrupted_save_leaves_a_directory_that_loading_refuses(tmp_path, monkeypatch):
    model = torch.nn.Linear(4, 2)
    save_checkpoint(tmp_path / "ckpt", model=model, step=5)
    calls = []

    def dies_on_the_second_file(state, path):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed mid-save")
        real_save(state, path)

    real_save = torch.save
    monkeypatch.setattr(torch, "save", dies_on_the_second_file)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "ckpt", model=model, step=6)
    with pytest.raises(FileNotFoundError, match="mado-checkpoint.json"):
        load_checkpoint(tmp_path / "ckpt", model=model)
    assert not list((tmp_path / "ckpt").glob(".*.tmp"))  # no temporary file left behind


def test_a_snapshot_taken_before_the_next_save_keeps_its_bytes(tmp_path):
    model = torch.nn.Linear(4, 2)
    save_checkpoint(tmp_path / "ckpt", model=model, step=1)
    snapshot = tmp_path / "model-snapshot.pt"
    os.link(tmp_path / "ckpt" / "model.pt", snapshot)  # what log_checkpoint(wait=False) keeps
    before = snapshot.read_bytes()
    with torch.no_grad():
        model.weight.add_(1.0)
    save_checkpoint(tmp_path / "ckpt", model=model, step=2)
    assert snapshot.read_bytes() == before
    assert (tmp_path / "ckpt" / "model.pt").read_bytes() != before
