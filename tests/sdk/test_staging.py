"""Snapshots of background checkpoint saves (docs/design/checkpoints.md#save-and-restore): read-only files are
hard-linked, others copied; a ``mado_tracking.torch`` save never changes a snapshot still waiting; a rewrite in place is
caught, not uploaded."""

import os

import pytest
import torch

from mado_tracking import CheckpointError
from mado_tracking.staging import left_behind, stage
from mado_tracking.torch import load_checkpoint, save_checkpoint


def _stage(source, root, step=1):
    return stage(
        source,
        root=root,
        step=step,
        run_id=7,
        idempotency_key=f"key-{step}",
        includes_optimizer=True,
        framework="torch",
    )


def test_read_only_files_are_linked_and_writable_ones_copied(tmp_path):
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "weights.bin").write_bytes(b"w" * 4096)
    (source / "weights.bin").chmod(0o444)
    (source / "notes.txt").write_text("writable")
    staged = _stage(source, tmp_path / "staging")
    assert os.path.samefile(staged.content / "weights.bin", source / "weights.bin")
    assert not os.path.samefile(staged.content / "notes.txt", source / "notes.txt")
    (source / "notes.txt").write_text("changed in place")
    assert (staged.content / "notes.txt").read_text() == "writable"
    staged.check_unchanged()


def test_the_next_torch_save_leaves_a_waiting_snapshot_as_it_was(tmp_path):
    model = torch.nn.Linear(3, 2)
    save_checkpoint(tmp_path / "ckpt", model=model, step=10)
    staged = _stage(tmp_path / "ckpt", tmp_path / "staging", step=10)
    saved_weight = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    save_checkpoint(tmp_path / "ckpt", model=model, step=20)
    staged.check_unchanged()
    restored = torch.nn.Linear(3, 2)
    assert load_checkpoint(staged.content, model=restored, restore_rng=False) == 10
    assert torch.equal(restored.weight, saved_weight) and not torch.equal(restored.weight, model.weight)


def test_a_linked_file_rewritten_in_place_is_refused_naming_it(tmp_path):
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "model.pt").write_bytes(b"a" * 100)
    (source / "model.pt").chmod(0o444)
    staged = _stage(source, tmp_path / "staging")
    (source / "model.pt").chmod(0o644)
    (source / "model.pt").write_bytes(b"b" * 50)  # same inode: the snapshot changed too
    with pytest.raises(CheckpointError, match="model.pt: was rewritten in place after log_checkpoint returned"):
        staged.check_unchanged()


def test_a_step_already_waiting_is_refused_and_left_behind_lists_only_whole_snapshots(tmp_path):
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "a.bin").write_bytes(b"a")
    root = tmp_path / "staging"
    _stage(source, root, step=1)
    with pytest.raises(CheckpointError, match="step 1 is already waiting for its upload"):
        _stage(source, root, step=1)
    (root / ".step-2.abc.partial").mkdir()  # a process killed while snapshotting
    (root / "step-3").mkdir()  # no staged.json: not a snapshot of ours
    (root / "step-5").mkdir()
    (root / "step-5" / "staged.json").write_text('{"step": 5, "run_id": 8, "idempotency_key": "k", "files": {}}')
    found = left_behind(root, run_id=7)
    assert [(item.step, item.idempotency_key, item.framework) for item in found] == [(1, "key-1", "torch")]
    assert not (root / ".step-2.abc.partial").exists() and (root / "step-5").exists()
