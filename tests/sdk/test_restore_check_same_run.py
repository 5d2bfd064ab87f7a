"""A Run resumed under its id that logs metrics without loading its checkpoint through mado_tracking gets one
warning and sends a restore report marking every part the checkpoint holds ``unknown``, so its resume segment
shows it (docs/design/checkpoints.md#restore-check, docs/design/resume.md#same-run-parity); one that loads the
checkpoint gets no such warning, and a Job's resume still sends nothing (its "resume ignored?" signal)."""

import logging
import os
from pathlib import Path

import pytest
import torch

import mado_tracking
from mado_tracking import restore_check
from mado_tracking.torch import load_checkpoint, save_checkpoint
from tests.sdk.data_position import Position
from tests.sdk.resume_stub import ResumeStubApi

pytestmark = pytest.mark.usefixtures("fresh_restore_check")


def _objects():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), Position()


@pytest.fixture
def stub(tmp_path, monkeypatch):
    monkeypatch.setenv("MMT_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("MMT_RESUME_CHECKPOINT_DIR", "MMT_RESUME_STEP", "MMT_RESUME_CHECKPOINT_FILE"):
        monkeypatch.delenv(name, raising=False)
    model, optimizer, position = _objects()
    position.index = 80
    saved = save_checkpoint(tmp_path / "step-20", model=model, optimizer=optimizer, step=20, data_position=position)
    with ResumeStubApi() as api:
        api.add_checkpoint(12, 20, directory=saved)
        yield api


def _resume(stub):
    return mado_tracking.start_run(
        project="vision", api_url=stub.url, api_token="stub-token", id="exp-1", resume="must"
    )


def _warnings(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if "mado: WARNING" in record.getMessage()]


def test_a_fetched_checkpoint_never_loaded_is_warned_about_once_and_reported_unknown(stub, caplog):
    with caplog.at_level(logging.WARNING, logger="mado_tracking"), _resume(stub) as run:
        checkpoint = run.resume_checkpoint()
        for step in range(checkpoint.step, checkpoint.step + 3):  # the program's own model, never loaded
            run.log_metrics({"train.loss": 1.0 / (step + 1)}, step=step)
    [warning] = _warnings(caplog)
    assert "resumes from checkpoint 12 (step 20), fetched by run.resume_checkpoint(), but loaded no checkpoint" in (
        warning
    )
    [report] = stub.restore_reports
    assert report["checkpoint_id"] == 12
    assert set(report["parts"]) >= {"model", "optimizer", "data_position", "global_step", "rng.python", "rng.torch"}
    assert set(report["parts"].values()) == {"unknown"}
    assert set(report["details"].values()) == {restore_check.NOT_LOADED_DETAIL}
    assert len(restore_check.NOT_LOADED_DETAIL) <= restore_check.DETAIL_MAX
    assert stub.events.index("restore-report") < stub.events.index("metrics")


def test_a_fetched_checkpoint_loaded_through_mado_tracking_is_not_warned_about(stub, caplog):
    model, optimizer, position = _objects()
    with caplog.at_level(logging.WARNING, logger="mado_tracking"), _resume(stub) as run:
        checkpoint = run.resume_checkpoint()
        load_checkpoint(checkpoint.path, model=model, optimizer=optimizer, data_position=position)
        run.log_metrics({"train.loss": 0.5}, step=checkpoint.step)
    assert _warnings(caplog) == []
    [report] = stub.restore_reports
    assert set(report["parts"].values()) == {"restored"}
    assert restore_check.NOT_LOADED_DETAIL not in report["details"].values()


def test_a_resume_that_never_asks_for_its_checkpoint_reports_it_unknown_from_its_metadata(stub, caplog):
    training_state = {"format": 1, "global_step": 20, "parts": {"model": {}, "optimizer": {}, "global_step": {}}}
    stub.checkpoints[12]["metadata"] = {"training_state": training_state}
    with caplog.at_level(logging.WARNING, logger="mado_tracking"), _resume(stub) as run:
        for step in range(3):  # starts over from scratch, loading nothing
            run.log_metrics({"train.loss": 1.0}, step=step)
    assert sum("run.resume_checkpoint() was not called" in line for line in _warnings(caplog)) == 1
    [report] = stub.restore_reports
    assert report == {
        "checkpoint_id": 12,
        "parts": dict.fromkeys(("model", "optimizer", "global_step"), "unknown"),
        "details": dict.fromkeys(("model", "optimizer", "global_step"), restore_check.NOT_FETCHED_DETAIL),
    }


def test_a_job_resume_that_loads_nothing_still_sends_no_report(stub, caplog, tmp_path, monkeypatch):
    info = tmp_path / "resume.json"
    info.write_text('{"checkpointId": 12, "sourceRunId": 1, "step": 20}')
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_DIR", str(Path(tmp_path / "step-20")))
    monkeypatch.setenv("MMT_RESUME_STEP", "20")
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_FILE", str(info))
    assert os.environ["MMT_RESUME_STEP"] == "20"
    with caplog.at_level(logging.WARNING, logger="mado_tracking"), _resume(stub) as run:
        run.resume_checkpoint()
        run.log_metrics({"train.loss": 1.0}, step=20)
    [warning] = _warnings(caplog)
    assert "resumes from checkpoint 12 (step 20) but loaded no checkpoint with" in warning
    assert stub.restore_reports == []
