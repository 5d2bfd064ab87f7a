"""The restore report each framework integration sends for a run resumed through its documented path: the Hugging
Face ``MadoCallback``, Lightning's ``MadoResume`` (and ``MadoLogger`` without it) and the Accelerate helper
(docs/integrations.md, "What a resume restored"; docs/design/checkpoints.md#restore-check). Each resumes a Job
(``MMT_RESUME_*``) against the stub API and reads the ``POST runs/1/restore-report/`` it got."""

import importlib.util
import logging
import os
from pathlib import Path

import pytest
import torch

from mado_tracking import restore_check
from tests.sdk.programs import set_job_resume_variables
from tests.sdk.stub_api import StubApi

os.environ.setdefault("HF_HUB_OFFLINE", "1")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"restore_report_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _fresh_check():
    """No check pending, and no Run an earlier test left open: a load reports to THE one open Run."""
    from mado_tracking import _base

    left_open = set(_base._open_runs)
    _base._open_runs.clear()
    restore_check.reset()
    yield
    restore_check.reset()
    _base._open_runs.update(left_open)


def _online(stub: StubApi) -> dict:
    return {"project": "vision", "api_url": stub.url, "api_token": "stub-token"}


def _not_restored(report: dict) -> dict:
    return {part: status for part, status in report["parts"].items() if status != "restored"}


# -- Hugging Face Trainer -------------------------------------------------------------------------------------------


def _hf_trainer(output_dir: Path, callback, *, steps: int, **changes):
    from transformers import Trainer

    hf = _example("hf_trainer")
    args = hf.training_arguments(hf.parse_args(["--steps", str(steps), "--checkpoint-every", "2"]), str(output_dir))
    for name, value in changes.items():
        setattr(args, name, value)
    torch.manual_seed(0)
    return Trainer(
        model=hf.build_model(),
        args=args,
        train_dataset=hf.TokenRule(64, 0),
        eval_dataset=hf.TokenRule(16, 1),
        callbacks=[callback],
    )


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory) -> Path:
    """``checkpoint-2`` of an offline 2-step Trainer run with ``MadoCallback``."""
    from mado_tracking.integrations.transformers import MadoCallback

    root = tmp_path_factory.mktemp("hf")
    callback = MadoCallback(offline=True, output=root / "run")
    trainer = _hf_trainer(root / "out", callback, steps=2)
    with callback.setup(trainer.args):
        trainer.train()
    return root / "out" / "checkpoint-2"


def _hf_resume(tmp_path, monkeypatch, checkpoint: Path, *, hand_over: bool = True, **changes) -> StubApi:
    from mado_tracking.integrations.transformers import MadoCallback, resume_from_checkpoint

    tmp_path.mkdir(exist_ok=True)
    set_job_resume_variables(monkeypatch, checkpoint, 2, tmp_path / "resume-checkpoint.json")
    with StubApi() as stub:
        callback = MadoCallback(**_online(stub), checkpoints=False, preemption=False)
        trainer = _hf_trainer(tmp_path / "again", callback, steps=4, save_strategy="no", eval_strategy="no", **changes)
        directory = resume_from_checkpoint(trainer)
        with callback.run:
            trainer.train(resume_from_checkpoint=directory if hand_over else None)
    return stub


def test_hf_the_documented_resume_reports_every_part_the_trainer_loaded(tmp_path, monkeypatch, hf_checkpoint, caplog):
    with caplog.at_level(logging.WARNING, logger="mado_tracking"):
        stub = _hf_resume(tmp_path, monkeypatch, hf_checkpoint)
    [report] = stub.restore_reports
    assert set(report["parts"]) >= {
        "model",
        "optimizer",
        "scheduler",
        "rng.python",
        "rng.numpy",
        "rng.torch",
        "data_position",
        "global_step",
    }
    assert _not_restored(report) == {} and report["details"] == {}
    assert stub.events.index("restore-report") < stub.events.index("metrics")
    assert not [r for r in caplog.records if "WARNING" in r.getMessage()]


def test_hf_a_trainer_not_given_the_checkpoint_or_told_to_ignore_the_data_position_says_so(
    tmp_path, monkeypatch, hf_checkpoint
):
    [ignored] = _hf_resume(tmp_path / "a", monkeypatch, hf_checkpoint, hand_over=False).restore_reports
    assert set(_not_restored(ignored)) >= {"model", "optimizer", "scheduler", "global_step", "data_position"}
    assert "resume_from_checkpoint=resume_from_checkpoint(trainer)" in ignored["details"]["model"]
    restore_check.reset()
    [skipped] = _hf_resume(tmp_path / "b", monkeypatch, hf_checkpoint, ignore_data_skip=True).restore_reports
    assert _not_restored(skipped) == {"data_position": "not_restored"}
    assert "ignore_data_skip=True" in skipped["details"]["data_position"]
