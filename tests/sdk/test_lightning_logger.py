"""``MadoLogger``: the Run's parameters, metrics at the global step, one Checkpoint per ModelCheckpoint save, the
Run's end; ``resume_ckpt_path`` (docs/integrations.md; docs/design/checkpoints.md#metadata;
docs/design/resume.md#steps-continue, #in-the-code). Offline runs: no server needed."""

import json
import logging
import math
from argparse import Namespace

import numpy
import pytest
import torch

import mado_tracking
from mado_tracking.errors import ResumeError
from mado_tracking.integrations.lightning import MadoLogger, flatten_parameters, resume_ckpt_path
from tests.sdk.lightning_fits import example, fit, restore_torch_globals
from tests.sdk.programs import set_job_resume_variables


@pytest.fixture(autouse=True)
def _torch_globals():
    restore = restore_torch_globals()
    yield
    restore()


def _record(directory) -> dict:
    return json.loads((directory / "run.json").read_text())


def _steps(directory, key: str) -> list[int]:
    lines = (directory / "metrics.jsonl").read_text().splitlines()
    return [point["step"] for point in map(json.loads, lines) if point["key"] == key]


def test_a_fit_records_parameters_metrics_at_each_global_step_and_a_checkpoint_per_save(tmp_path):
    logger = MadoLogger(offline=True, output=tmp_path / "run", parameters={"data": {"samples": 256}})
    fit(tmp_path / "ckpt", logger=logger, save_last=True)
    record = _record(tmp_path / "run")
    assert record["status"] == "finished"
    # given ones and the model's save_hyperparameters(), flattened
    assert record["parameters"] == {"data/samples": 256, "hidden": 32, "dropout": 0.2, "lr": 0.1}
    assert _steps(tmp_path / "run", "train.loss") == list(range(40))
    saved = record["checkpoints"]
    assert [entry["step"] for entry in saved] == [10, 20, 30, 40]  # last.ckpt, the same state, not again
    assert sorted(path.name for path in (tmp_path / "run" / "checkpoints" / "step-20").iterdir()) == [
        "epoch=1-step=20.ckpt"
    ]
    state = saved[1]["metadata"]["training_state"]
    assert state["global_step"] == 20
    assert sorted(state["parts"]) == ["data_position", "model", "optimizer", "rng.numpy", "rng.python", "rng.torch"]
    assert state["parts"]["model"] == {"file": "epoch=1-step=20.ckpt"}
    assert all(entry["framework"] == "lightning" and entry["includes_optimizer"] for entry in saved)


def test_a_failing_fit_fails_the_run_it_started_after_its_checkpoints(tmp_path):
    logger = MadoLogger(offline=True, output=tmp_path / "run")
    with pytest.raises(example.SimulatedFailure):
        fit(tmp_path / "ckpt", logger=logger, fail_at=27)
    record = _record(tmp_path / "run")
    assert record["status"] == "failed"
    assert [entry["step"] for entry in record["checkpoints"]] == [10, 20]
    assert _steps(tmp_path / "run", "train.loss") == list(range(27))


def test_a_run_handed_in_stays_open_for_its_owner(tmp_path, caplog):
    with mado_tracking.start_run(offline=True, output=tmp_path / "run", parameters={"hidden": 32}) as run:
        with caplog.at_level(logging.WARNING, logger="mado_tracking"):
            fit(tmp_path / "ckpt", logger=MadoLogger(run), steps=10)
        assert run.status == "running"
        run.log_metrics({"test.accuracy": 0.5}, step=10)  # the owner goes on logging after fit
    assert _record(tmp_path / "run")["status"] == "finished"
    [warning] = [record.getMessage() for record in caplog.records if record.name == "mado_tracking"]
    assert warning.startswith("mado: hyperparameters dropout, lr are not recorded on run")
    assert "start_run(parameters=...)" in warning


def test_finalize_ends_the_run_only_on_success_or_failure(tmp_path):
    logger = MadoLogger(offline=True, output=tmp_path / "run")
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.finalize("finished")  # what Lightning's SLURM requeue handler sends mid-training, to flush
    assert logger.run.status == "running"
    logger.finalize("success")
    assert _record(tmp_path / "run")["status"] == "finished"
    logger.log_metrics({"loss": 0.5}, step=1)  # e.g. trainer.test() after fit: dropped with a warning
    assert _steps(tmp_path / "run", "loss") == [0]


def test_the_run_starts_with_the_hyperparameters_and_its_id_is_known_before(tmp_path):
    logger = MadoLogger(offline=True, output=tmp_path / "run", name="mlp")
    version = logger.version  # ModelCheckpoint's default directory asks this first
    assert not logger.started and _RunOnFirstUse_is(logger.experiment)
    logger.log_hyperparams(Namespace(lr=0.1, optim=Namespace(name="sgd")))
    assert logger.started and logger.run.external_id == version and logger.experiment is logger.run
    assert _record(tmp_path / "run")["parameters"] == {"lr": 0.1, "optim/name": "sgd"}


def _RunOnFirstUse_is(value) -> bool:  # noqa: N802 - reads as the type it checks
    return type(value).__name__ == "_RunOnFirstUse"


def test_flatten_parameters_makes_any_hyperparameters_json_safe():
    flat = flatten_parameters(
        {
            "nested": {"deeper": {"x": 1}, "empty": {}},
            "ns": Namespace(a=True),
            "tensor": torch.tensor(0.5),
            "one": torch.tensor([3]),
            "many": torch.ones(2),
            "np": numpy.float32(0.25),
            "npint": numpy.int64(7),
            "nan": float("nan"),
            "inf": -math.inf,
            "fn": flatten_parameters,
            "obj": object,
            "list": [1, torch.tensor(2.0), (None, "s")],
            "none": None,
        }
    )
    assert flat == {
        "nested/deeper/x": 1,
        "ns/a": True,
        "tensor": 0.5,
        "one": 3,
        "many": "tensor([1., 1.])",
        "np": 0.25,
        "npint": 7,
        "nan": "nan",
        "inf": "-inf",
        "fn": "flatten_parameters",
        "obj": "object",
        "list": [1, 2.0, [None, "s"]],
        "none": None,
    }
    json.dumps(flat, allow_nan=False)
    with pytest.raises(ValueError, match="hyperparameters must be a dict or argparse.Namespace, got list"):
        flatten_parameters([1, 2])


def _resume_env(monkeypatch, directory, step=20):
    set_job_resume_variables(monkeypatch, directory, step, directory.parent / "resume.json")


def test_resume_ckpt_path_is_none_unless_resuming_and_never_starts_the_run_for_it(tmp_path):
    logger = MadoLogger(offline=True, output=tmp_path / "run")
    assert resume_ckpt_path(logger) is None and resume_ckpt_path() is None
    assert not logger.started


def test_resume_ckpt_path_is_the_one_ckpt_file_of_the_checkpoint(tmp_path, monkeypatch):
    directory = tmp_path / "step-20"
    (directory / "sub").mkdir(parents=True)
    (directory / "sub" / "epoch=1-step=20.ckpt").write_bytes(b"x")
    (directory / "notes.txt").write_text("kept")
    _resume_env(monkeypatch, directory)
    logger = MadoLogger(offline=True, output=tmp_path / "run")
    assert resume_ckpt_path(logger) == str(directory / "sub" / "epoch=1-step=20.ckpt")
    assert not logger.started
    with mado_tracking.start_run(offline=True, output=tmp_path / "other") as run:
        assert resume_ckpt_path(run) == str(directory / "sub" / "epoch=1-step=20.ckpt")


@pytest.mark.parametrize("files", [[], ["a.ckpt", "b.ckpt"]], ids=["none", "two"])
def test_resume_ckpt_path_refuses_a_checkpoint_without_exactly_one_ckpt_file(tmp_path, monkeypatch, files):
    directory = tmp_path / "step-20"
    directory.mkdir()
    (directory / "model.pt").write_bytes(b"x")
    for name in files:
        (directory / name).write_bytes(b"x")
    _resume_env(monkeypatch, directory)
    with pytest.raises(ResumeError, match=rf"expected one Lightning checkpoint file \(\*\.ckpt\).*found {len(files)}"):
        resume_ckpt_path()
