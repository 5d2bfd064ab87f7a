"""``resume_checkpoint`` reads the ``MMT_RESUME_*`` variables of a resumed run (docs/design/worker.md#extract;
docs/design/resume.md#in-the-code)."""

import json
from pathlib import Path

import pytest

import mado_tracking
from mado_tracking import ResumeError


@pytest.fixture
def resume_env(monkeypatch, tmp_path):
    """A checkpoint directory, its ``resume-checkpoint.json`` and the three variables pointing at them."""
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    (directory / "model.pt").write_bytes(b"weights")
    info = tmp_path / "resume-checkpoint.json"
    info.write_text(json.dumps({"checkpointId": 41, "sourceRunId": 7, "step": 20, "artifactPath": "x"}))
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_DIR", str(directory))
    monkeypatch.setenv("MMT_RESUME_STEP", "20")
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_FILE", str(info))
    return {"dir": directory, "file": info}


def test_it_is_none_when_not_resuming():
    assert mado_tracking.resume_checkpoint() is None


def test_it_reads_the_checkpoint_from_the_variables_and_the_json_file(resume_env):
    checkpoint = mado_tracking.resume_checkpoint()
    assert checkpoint.path == resume_env["dir"] and isinstance(checkpoint.path, Path)
    assert (checkpoint.step, checkpoint.id, checkpoint.source_run_id) == (20, 41, 7)
    assert checkpoint.info["artifactPath"] == "x"


def test_an_offline_run_returns_it_too(resume_env, tmp_path):
    with mado_tracking.start_run(offline=True, output=tmp_path / "run") as run:
        assert run.resume_checkpoint() == mado_tracking.resume_checkpoint()
        assert run.resume_checkpoint().step == 20


def test_a_step_that_differs_from_the_file_is_a_clear_error(resume_env, monkeypatch):
    monkeypatch.setenv("MMT_RESUME_STEP", "30")
    with pytest.raises(ResumeError, match="MMT_RESUME_STEP=30 but .* says step 20"):
        mado_tracking.resume_checkpoint()


@pytest.mark.parametrize("missing", ["MMT_RESUME_CHECKPOINT_DIR", "MMT_RESUME_STEP", "MMT_RESUME_CHECKPOINT_FILE"])
def test_only_some_of_the_variables_is_an_error_naming_the_missing_one(resume_env, monkeypatch, missing):
    monkeypatch.delenv(missing)
    with pytest.raises(ResumeError, match=f"{missing} not set"):
        mado_tracking.resume_checkpoint()


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("MMT_RESUME_STEP", "twenty", "MMT_RESUME_STEP must be an int >= 0"),
        ("MMT_RESUME_STEP", "-1", "MMT_RESUME_STEP must be an int >= 0"),
        (
            "MMT_RESUME_CHECKPOINT_DIR",
            "/nonexistent/ckpt",
            "MMT_RESUME_CHECKPOINT_DIR=/nonexistent/ckpt: not a directory",
        ),
        (
            "MMT_RESUME_CHECKPOINT_FILE",
            "/nonexistent/r.json",
            "MMT_RESUME_CHECKPOINT_FILE=/nonexistent/r.json: cannot be read",
        ),
    ],
)
def test_bad_values_are_errors_naming_the_variable(resume_env, monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ResumeError, match=message):
        mado_tracking.resume_checkpoint()


@pytest.mark.parametrize(
    ("content", "message"),
    [("not json", "not valid JSON"), ("[20]", "JSON object"), ('{"checkpointId": 1}', '"step" must be an int')],
)
def test_a_malformed_json_file_is_an_error(resume_env, content, message):
    resume_env["file"].write_text(content)
    with pytest.raises(ResumeError, match=message):
        mado_tracking.resume_checkpoint()
