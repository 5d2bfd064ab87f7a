"""Offline runs (docs/design/runs.md#offline): the directory layout, no server needed, the same refusals."""

import json
import math
import os

import pytest
import requests

import mado_tracking
from mado_tracking import CheckpointError, MadoError, OfflineRun


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("an offline run made an HTTP request")

    monkeypatch.setattr(requests.Session, "request", refuse)


@pytest.fixture
def ckpt(tmp_path):
    root = tmp_path / "ckpt"
    (root / "sub").mkdir(parents=True)
    (root / "model.pt").write_bytes(b"w" * 5000)
    (root / "sub" / "state.pt").write_bytes(b"s" * 10)
    return root


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_offline_run_writes_run_json_metrics_and_checkpoints(tmp_path, ckpt):
    out = tmp_path / "out"
    with mado_tracking.start_run(
        "vision", name="local", kind="fine_tuning", parameters={"lr": 0.1}, offline=True, output=out
    ) as run:
        assert isinstance(run, OfflineRun) and run.id is None
        record = json.loads((out / "run.json").read_text())
        assert record["status"] == "running" and record["ended_at"] is None
        run.log_metrics({"train.loss": 0.5, "grad": math.inf}, step=0)
        run.log_metrics({"train.loss": math.nan, "val/λ": 0.25}, step=1)
        assert len(_lines(out / "metrics.jsonl")) == 4  # appended and flushed at once
        saved = run.log_checkpoint(ckpt, step=10, includes_optimizer=True, framework="torch")
    record = json.loads((out / "run.json").read_text())
    assert {k: record[k] for k in ("project", "name", "kind", "parameters", "external_id", "status")} == {
        "project": "vision",
        "name": "local",
        "kind": "fine_tuning",
        "parameters": {"lr": 0.1},
        "external_id": run.external_id,
        "status": "finished",
    }
    assert record["created_at"] and record["started_at"] and record["ended_at"]
    points = _lines(out / "metrics.jsonl")
    assert [(p["key"], p["value"], p["step"]) for p in points] == [
        ("train.loss", 0.5, 0),
        ("grad", "Infinity", 0),
        ("train.loss", "NaN", 1),
        ("val/λ", 0.25, 1),
    ]
    assert all(isinstance(p["timestamp"], float) for p in points)
    copied = out / "checkpoints" / "step-10"
    assert (copied / "model.pt").read_bytes() == b"w" * 5000
    assert (copied / "sub" / "state.pt").read_bytes() == b"s" * 10
    assert saved.id is None and saved.step == 10 and len(saved.sha256) == 64
    assert record["checkpoints"][0] | {"created_at": None} == {
        "step": 10,
        "framework": "torch",
        "includes_optimizer": True,
        "file_count": 2,
        "total_bytes": 5010,
        "tar_size": saved.tar_size,
        "tar_sha256": saved.sha256,
        "created_at": None,
    }
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-10"]  # no temporary left


def test_mmt_mode_offline_and_mmt_offline_dir_need_no_configuration(tmp_path, monkeypatch):
    monkeypatch.setenv("MMT_MODE", "offline")
    monkeypatch.setenv("MMT_OFFLINE_DIR", str(tmp_path / "env-dir"))
    with mado_tracking.start_run() as run:
        run.log_metrics({"loss": 1.0}, step=0)
    assert run.offline and run.directory == tmp_path / "env-dir"
    assert json.loads((tmp_path / "env-dir" / "run.json").read_text())["project"] is None


def test_the_default_directory_is_named_after_the_run_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with mado_tracking.start_run(offline=True) as run:
        pass
    assert (tmp_path / "mado-offline" / run.external_id / "run.json").exists()


def test_an_exception_marks_the_offline_run_failed(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with mado_tracking.start_run(offline=True, output=tmp_path) as run:
            _ = 1 / 0
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "failed"
    assert run.status == "failed"


def _link(root):
    (root / "sub" / "link").symlink_to(root / "model.pt")
    return "sub/link: is a symbolic link"


def _empty(root):
    (root / "logs").mkdir()
    return "logs: empty directory"


def _fifo(root):
    os.mkfifo(root / "pipe")
    return "pipe: is not a regular file"


@pytest.mark.parametrize("spoil", [_link, _empty, _fifo])
def test_the_online_refusals_hold_offline(tmp_path, ckpt, spoil):
    reason = spoil(ckpt)
    with mado_tracking.start_run(offline=True, output=tmp_path / "out") as run:
        with pytest.raises(CheckpointError, match=reason):
            run.log_checkpoint(ckpt, step=1)
        with pytest.raises(CheckpointError, match="step must be >= 0"):
            run.log_checkpoint(ckpt, step=-1)
    assert not (tmp_path / "out" / "checkpoints").exists() or not any((tmp_path / "out" / "checkpoints").iterdir())


def test_a_step_saved_twice_is_refused_and_the_first_copy_kept(tmp_path, ckpt):
    with mado_tracking.start_run(offline=True, output=tmp_path / "out") as run:
        run.log_checkpoint(ckpt, step=5)
        (ckpt / "model.pt").write_bytes(b"changed")
        with pytest.raises(CheckpointError, match="step 5 is already saved in offline run"):
            run.log_checkpoint(ckpt, step=5)
    assert (tmp_path / "out" / "checkpoints" / "step-5" / "model.pt").read_bytes() == b"w" * 5000
    assert len(json.loads((tmp_path / "out" / "run.json").read_text())["checkpoints"]) == 1


def test_a_fresh_run_in_a_directory_holding_another_run_is_refused(tmp_path):
    with mado_tracking.start_run(offline=True, output=tmp_path) as first:
        first.log_metrics({"loss": 1.0}, step=0)
    with pytest.raises(MadoError, match=f"already holds offline run {first.external_id}"):
        mado_tracking.start_run(offline=True, output=tmp_path)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1


def test_a_run_resuming_from_a_checkpoint_continues_the_directory_record(tmp_path, ckpt, monkeypatch):
    with pytest.raises(RuntimeError):
        with mado_tracking.start_run(offline=True, output=tmp_path) as first:
            first.log_metrics({"loss": 1.0}, step=0)
            first.log_checkpoint(ckpt, step=1)
            raise RuntimeError("crash")
    (tmp_path / "resume.json").write_text('{"checkpointId": "local", "sourceRunId": "local", "step": 1}')
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_DIR", str(tmp_path / "checkpoints" / "step-1"))
    monkeypatch.setenv("MMT_RESUME_STEP", "1")
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_FILE", str(tmp_path / "resume.json"))
    with mado_tracking.start_run(offline=True, output=tmp_path) as second:
        second.log_metrics({"loss": 0.5}, step=1)
        second.log_checkpoint(ckpt, step=2)
    assert second.external_id == first.external_id
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["status"] == "finished"
    assert [a["status"] for a in record["attempts"]] == ["failed", "finished"]
    assert record["attempts"][1]["resumed_from"]["step"] == 1
    assert [c["step"] for c in record["checkpoints"]] == [1, 2]
    assert [p["step"] for p in _lines(tmp_path / "metrics.jsonl")] == [0, 1]
