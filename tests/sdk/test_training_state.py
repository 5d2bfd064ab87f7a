"""Every checkpoint says what training state it holds: ``save_checkpoint`` fingerprints each part into
``mado-checkpoint.json``, ``run.log_checkpoint`` sends it as the ``training_state`` metadata, ``state=`` fingerprints
the live objects of a plain directory (docs/design/checkpoints.md#training-state, #metadata)."""

import json

import pytest
import torch

import mado_tracking
from checkpoints.models import Checkpoint
from mado_tracking.errors import CheckpointError
from mado_tracking.fingerprint import digest
from mado_tracking.torch import save_checkpoint


def _objects():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    model(torch.rand(2, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def _offline(tmp_path):
    return mado_tracking.start_run(offline=True, output=tmp_path / "offline")


def _saved_metadata(tmp_path) -> list:
    record = json.loads((tmp_path / "offline" / "run.json").read_text())
    return [entry.get("metadata") for entry in record["checkpoints"]]


def test_save_checkpoint_fingerprints_each_part_of_what_it_wrote(tmp_path):
    model, optimizer, scheduler = _objects()
    generator = torch.Generator().manual_seed(1)
    save_checkpoint(
        tmp_path,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        step=5,
        generators={"batches": generator},
        data_position={"epoch": 1, "index": 64},
    )
    state = json.loads((tmp_path / "mado-checkpoint.json").read_text())["training_state"]
    assert (state["format"], state["global_step"]) == (1, 5)
    parts = state["parts"]
    assert {"model", "optimizer", "scheduler", "data_position", "rng.python", "rng.torch"} <= set(parts)
    assert {"generator.batches", "global_step"} <= set(parts)
    for part in ("model", "optimizer", "scheduler", "data_position"):
        stored = torch.load(tmp_path / parts[part]["file"], weights_only=True)
        assert parts[part]["sha256"] == digest(stored), part
    rng = torch.load(tmp_path / "rng.pt", weights_only=True)
    assert parts["generator.batches"] == {"sha256": digest(rng["generators"]["batches"]), "file": "rng.pt"}
    assert parts["model"]["sha256"] == digest(model.state_dict())
    model.weight.data[0, 0] += 1e-7
    assert parts["model"]["sha256"] != digest(model.state_dict())


def test_log_checkpoint_sends_the_directorys_fingerprint_unless_metadata_has_one(tmp_path):
    model, optimizer, _ = _objects()
    save_checkpoint(tmp_path / "ckpt", model=model, optimizer=optimizer, step=1)
    written = json.loads((tmp_path / "ckpt" / "mado-checkpoint.json").read_text())["training_state"]
    with _offline(tmp_path) as run:
        run.log_checkpoint(tmp_path / "ckpt", step=1, metadata={"note": "kept"})
        run.log_checkpoint(tmp_path / "ckpt", step=2, metadata={"training_state": {"mine": True}})
    assert _saved_metadata(tmp_path) == [
        {"note": "kept", "training_state": written},
        {"training_state": {"mine": True}},
    ]


def test_a_plain_directory_gets_the_fingerprint_of_state_or_none(tmp_path):
    model, optimizer, _ = _objects()
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "weights.bin").write_bytes(b"my own format")
    with _offline(tmp_path) as run:
        run.log_checkpoint(tmp_path / "plain", step=1)
        run.log_checkpoint(tmp_path / "plain", step=2, state={"model": model, "optimizer": optimizer, "rng": False})
        (tmp_path / "plain" / "mado-checkpoint.json").write_text("{not json")
        run.log_checkpoint(tmp_path / "plain", step=3)
    first, second, third = _saved_metadata(tmp_path)
    assert first is None and third is None
    parts = second["training_state"]["parts"]
    assert sorted(parts) == ["global_step", "model", "optimizer"]
    assert parts["model"] == {"sha256": digest(model.state_dict())}


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"modle": object()}, "state has unknown key(s) modle"),
        ("model", "state must be a dict of the training objects"),
        ({"model": 3}, "state['model'] has no state_dict()"),
    ],
)
def test_a_bad_state_is_refused_naming_it_and_nothing_is_saved(tmp_path, state, message):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "weights.bin").write_bytes(b"x")
    with _offline(tmp_path) as run:
        with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            run.log_checkpoint(tmp_path / "plain", step=1, state=state)
    assert not (tmp_path / "offline" / "checkpoints").exists()


@pytest.mark.django_db(transaction=True)
def test_online_the_checkpoint_keeps_the_training_state(mmt_env, tmp_path):
    model, optimizer, scheduler = _objects()
    save_checkpoint(tmp_path / "ckpt", model=model, optimizer=optimizer, scheduler=scheduler, step=4)
    written = json.loads((tmp_path / "ckpt" / "mado-checkpoint.json").read_text())["training_state"]
    with mado_tracking.start_run() as run:
        saved = run.log_checkpoint(tmp_path / "ckpt", step=4, includes_optimizer=True, framework="torch")
    assert Checkpoint.objects.get(pk=saved.id).metadata == {"training_state": written}
