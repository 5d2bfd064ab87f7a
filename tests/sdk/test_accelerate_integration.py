"""``mado_tracking.integrations.accelerate``: ``accelerator.save_state`` logged as a Checkpoint at the loop's step with
what it holds, restored by ``load_state`` from a read-only directory, the data position included, and the
preemption helpers (docs/integrations.md; docs/design/checkpoints.md#metadata, #save-and-restore;
docs/design/resume.md#in-the-code; docs/design/runs.md#preemption). Offline runs: no server needed."""

import hashlib
import json
import logging
import os
import signal
import stat
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import ProjectConfiguration
from torch.utils.data import DataLoader, TensorDataset

import mado_tracking
from mado_tracking.errors import MadoError
from mado_tracking.integrations import accelerate as mado_accelerate
from tests.sdk.programs import set_job_resume_variables

EXAMPLES, BATCH = 24, 4  # an epoch is 6 batches


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _prepared(*, seedable: bool = True, **accelerator_kwargs):
    """A fresh Accelerator with a model (dropout), AdamW, a scheduler and a shuffled loader, all seeded alike."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    torch.manual_seed(0)
    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=seedable), **accelerator_kwargs
    )
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.1, total_iters=20)
    x = torch.arange(EXAMPLES * 3, dtype=torch.float32).reshape(EXAMPLES, 3) / 10
    loader = DataLoader(TensorDataset(x, torch.arange(EXAMPLES) % 2), batch_size=BATCH, shuffle=True)
    return accelerator, *accelerator.prepare(model, optimizer, loader, scheduler)


def _train(accelerator, model, optimizer, loader, scheduler, count: int, after=None) -> list[list[float]]:
    """``count`` steps over one ``batches``; the first feature of each batch's examples, in order. ``after(n)`` is
    called after the n-th step."""
    seen = []
    if count == 0:
        return seen
    for x, y in mado_accelerate.batches(accelerator, loader):
        accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        seen.append(x[:, 0].tolist())
        if after is not None:
            after(len(seen))
        if len(seen) == count:
            return seen
    return seen


def _files(directory: Path) -> dict[str, tuple[str, int]]:
    return {
        p.relative_to(directory).as_posix(): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
    }


def _resume_from(monkeypatch, tmp_path: Path, directory: Path, step: int) -> None:
    set_job_resume_variables(monkeypatch, directory, step, tmp_path / "resume-checkpoint.json")


def test_save_state_logs_what_accelerate_wrote_at_the_step_with_what_it_holds(tmp_path):
    accelerator, *prepared = _prepared()
    with mado_tracking.start_run(offline=True, output=tmp_path / "off") as run:
        _train(accelerator, *prepared, 9)
        saved = mado_accelerate.save_state(accelerator, run, 9)
        kept = mado_accelerate.save_state(accelerator, run, 10, tmp_path / "mine", wait=True, metadata={"note": "n"})
    assert saved.result().step == 9 and kept.step == 10
    stored = tmp_path / "off" / "checkpoints" / "step-9"
    assert sorted(p.name for p in stored.iterdir()) == [
        "mado_data_position.json",
        "model.safetensors",
        "optimizer.bin",
        "random_states_0.pkl",
        "scheduler.bin",
    ]
    position = {"loaders": {"0": {"epoch": 1, "batches": 3}}}
    assert json.loads((stored / "mado_data_position.json").read_text()) == position
    records = {c["step"]: c for c in json.loads((tmp_path / "off" / "run.json").read_text())["checkpoints"]}
    assert (records[9]["framework"], records[9]["includes_optimizer"]) == ("accelerate", True)
    rng = {"file": "random_states_0.pkl"}
    assert records[9]["metadata"] == {
        "training_state": {
            "parts": {
                "model": {"file": "model.safetensors"},
                "optimizer": {"file": "optimizer.bin"},
                "scheduler": {"file": "scheduler.bin"},
                "rng.python": rng,
                "rng.numpy": rng,
                "rng.torch": rng,
                "data_position": {
                    "file": "mado_data_position.json",
                    "loaders": {"0": {"epoch": 1, "batches": 3}},
                },
            },
            "global_step": 9,
            "processes": 1,
        }
    }
    assert records[10]["metadata"]["note"] == "n" and records[10]["metadata"]["training_state"]["global_step"] == 10
    assert list((tmp_path / ".mado" / "cache" / "accelerate").iterdir()) == []  # the managed copy is gone
    mine = tmp_path / "mine" / "step-10"
    assert all(not p.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) for p in mine.iterdir())


def test_load_state_restores_every_part_from_a_read_only_directory_and_continues_mid_epoch_alike(
    tmp_path, monkeypatch, caplog
):
    accelerator, model, *rest = _prepared()
    with mado_tracking.start_run(offline=True, output=tmp_path / "first") as run:

        def save_at_9(n: int) -> None:
            if n == 9:
                mado_accelerate.save_state(accelerator, run, 9, tmp_path / "ckpt", wait=True)

        expected_batches = _train(accelerator, model, *rest, 17, after=save_at_9)[9:]  # into epoch 2
    expected_weights = {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    checkpoint = tmp_path / "ckpt" / "step-9"
    for path in checkpoint.iterdir():
        path.chmod(0o444)
    checkpoint.chmod(0o555)
    before = _files(checkpoint)

    _resume_from(monkeypatch, tmp_path, checkpoint, 9)
    accelerator, model, *rest = _prepared()
    with caplog.at_level(logging.INFO, logger="mado_tracking"):
        with mado_tracking.start_run(offline=True, output=tmp_path / "resumed") as run:
            assert mado_accelerate.load_state(accelerator, run) == 9
            assert mado_accelerate.data_position(accelerator, rest[1]) == mado_accelerate.DataPosition(1, 3)
            assert _train(accelerator, model, *rest, 8) == expected_batches
    weights = accelerator.unwrap_model(model).state_dict()
    assert all(torch.equal(weights[k], expected_weights[k]) for k in expected_weights)  # dropout masks too
    assert _files(checkpoint) == before  # nothing written, renamed or touched
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    checkpoint.chmod(0o755)


def test_a_plain_shuffled_loader_resumed_mid_epoch_is_announced_before_training(tmp_path, monkeypatch, caplog):
    accelerator, *prepared = _prepared(seedable=False)
    with mado_tracking.start_run(offline=True, output=tmp_path / "first") as run:
        _train(accelerator, *prepared, 3)
        mado_accelerate.save_state(accelerator, run, 3, tmp_path / "ckpt")
    _resume_from(monkeypatch, tmp_path, tmp_path / "ckpt" / "step-3", 3)
    accelerator, *prepared = _prepared(seedable=False)
    with mado_tracking.start_run(offline=True, output=tmp_path / "resumed") as run:
        with caplog.at_level(logging.WARNING, logger="mado_tracking"):
            assert mado_accelerate.load_state(accelerator, run) == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    (warning,) = [line for line in warnings if "resumes in epoch" in line]
    assert "resumes in epoch 0 after 3 batches" in warning and "use_seedable_sampler=True" in warning
    (report,) = [line for line in warnings if "not restored from" in line]  # the restore report's line
    assert "data_position — loader 0's shuffled order" in report


def test_a_checkpoint_without_a_data_position_says_every_loader_starts_again(tmp_path, monkeypatch, caplog):
    accelerator, model, optimizer, loader, scheduler = _prepared()
    with mado_tracking.start_run(offline=True, output=tmp_path / "first") as run:
        for _ in zip(range(2), loader):  # the user's own loop, not batches()
            pass
        mado_accelerate.save_state(accelerator, run, 2, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt" / "step-2" / "mado_data_position.json").exists()
    _resume_from(monkeypatch, tmp_path, tmp_path / "ckpt" / "step-2", 2)
    accelerator, *prepared = _prepared()
    with mado_tracking.start_run(offline=True, output=tmp_path / "resumed") as run:
        with caplog.at_level(logging.WARNING, logger="mado_tracking"):
            assert mado_accelerate.load_state(accelerator, run) == 2
    assert any("records no data position" in r.getMessage() for r in caplog.records)


def test_batches_goes_on_epoch_after_epoch_and_stops_after_epochs(tmp_path):
    accelerator, model, optimizer, loader, scheduler = _prepared()
    orders = []
    for x, _ in mado_accelerate.batches(accelerator, loader, epochs=2):
        orders.append(x[:, 0].tolist())
    assert len(orders) == 2 * EXAMPLES // BATCH
    first, second = (sorted(sum(orders[i : i + 6], [])) for i in (0, 6))
    assert first == second and orders[:6] != orders[6:]  # every example once per epoch, each epoch its own order
    assert mado_accelerate.data_position(accelerator, loader) == mado_accelerate.DataPosition(2, 0)


@pytest.mark.parametrize(
    ("step", "metadata", "field"),
    [(-1, None, "step"), (True, None, "step"), ("3", None, "step"), (2.0, None, "step"), (3, ["a"], "metadata")],
)
def test_save_state_refuses_a_bad_step_or_metadata_before_writing_anything(tmp_path, step, metadata, field):
    accelerator, *_ = _prepared()
    with mado_tracking.start_run(offline=True, output=tmp_path / "off") as run:
        with pytest.raises(ValueError, match=field):
            mado_accelerate.save_state(accelerator, run, step, tmp_path / "ckpt", metadata=metadata)
    assert not (tmp_path / "ckpt").exists()


def test_misuse_is_refused_naming_what_to_do(tmp_path):
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="accelerator.prepare"):
        mado_accelerate.load_state(accelerator, None)
    with pytest.raises(ValueError, match="accelerator.prepare"):
        next(mado_accelerate.batches(accelerator, DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=2)))
    accelerator, *_ = _prepared()
    with pytest.raises(ValueError, match="run"):
        mado_accelerate.save_state(accelerator, None, 1, tmp_path / "ckpt")
    with pytest.raises(ValueError, match="every process needs its Run"):
        mado_accelerate.load_state(accelerator, None)
    with pytest.raises(MadoError, match="no stop signal"):
        mado_accelerate.save_and_exit(accelerator, None, 1)
    naming, *_ = _prepared(
        project_config=ProjectConfiguration(project_dir=str(tmp_path / "p"), automatic_checkpoint_naming=True)
    )
    with pytest.raises(ValueError, match="automatic_checkpoint_naming"):
        mado_accelerate.save_state(naming, None, 1)
    assert not (tmp_path / "p").exists()


def test_a_stop_signal_saves_with_the_signal_and_exits_as_preempted(tmp_path, monkeypatch):
    monkeypatch.setattr(mado_accelerate, "_preemption", None)
    accelerator, *prepared = _prepared()
    stop = None
    try:
        with pytest.raises(SystemExit) as exited:
            with mado_tracking.start_run(offline=True, output=tmp_path / "off") as run:
                stop = mado_accelerate.install_preemption(run)
                assert mado_accelerate.install_preemption(run) is stop  # once per process
                _train(accelerator, *prepared, 2)
                assert not mado_accelerate.should_stop(accelerator)
                os.kill(os.getpid(), signal.SIGUSR1)
                assert mado_accelerate.should_stop(accelerator)
                mado_accelerate.save_and_exit(accelerator, run, 2)
    finally:
        if stop is not None:
            stop.uninstall()
    assert exited.value.code == 128 + signal.SIGUSR1
    record = json.loads((tmp_path / "off" / "run.json").read_text())
    assert record["status"] == "preempted"
    (checkpoint,) = record["checkpoints"]
    assert checkpoint["step"] == 2 and checkpoint["metadata"]["preemption"]["signal"] == "SIGUSR1"
    assert checkpoint["metadata"]["training_state"]["global_step"] == 2
