"""``mado_tracking.integrations.transformers`` with the real Hugging Face Trainer (docs/integrations.md;
docs/design/checkpoints.md#metadata; docs/design/resume.md#in-the-code, #steps-continue;
docs/design/runs.md#preemption): ``examples/hf_trainer.py`` offline (fail at 27, resume from a read-only step-20
checkpoint, same weights), online on SIGTERM (a complete checkpoint, a preempted Run), and the callback's parts.
"""

import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

import mado_tracking
from mado_tracking.integrations.transformers import (
    MadoCallback,
    resume_from_checkpoint,
    training_parameters,
    training_state,
)
from tests.sdk.programs import job_resume_variables, run_example, set_job_resume_variables, signal_once_ready

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from transformers import BertConfig, BertForSequenceClassification, TrainerState, TrainingArguments  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_trainer.py"
ARGS = ["--steps", "40", "--checkpoint-every", "10"]


def _example(*args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    return run_example(EXAMPLE, *args, env={"HF_HUB_OFFLINE": "1", **(env or {})}, cwd=cwd)


def _tree(directory: Path) -> dict:
    """Every file under ``directory``: its SHA-256, size and mtime (what a write would change)."""
    return {
        str(path.relative_to(directory)): (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_size)
        + (path.stat().st_mtime_ns,)
        for path in sorted(directory.rglob("*"))
    }


def _steps(run_dir: Path, key: str) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [point["step"] for point in map(json.loads, lines) if point["key"] == key]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> bytes:
    """The final weights of an uninterrupted offline 40-step Trainer run."""
    output = tmp_path_factory.mktemp("uninterrupted") / "weights.safetensors"
    done = _example("--offline", *ARGS, "--output", str(output), cwd=output.parent)
    assert done.returncode == 0, done.stderr
    return output.read_bytes()


def test_offline_a_trainer_failing_at_27_resumed_from_a_read_only_step_20_ends_with_the_uninterrupted_weights(
    tmp_path, uninterrupted
):
    failed_dir, resumed_dir = tmp_path / "failed", tmp_path / "resumed"
    failed = _example("--offline", *ARGS, "--fail-at-step", "27", "--output", str(failed_dir / "w.safetensors"))
    assert failed.returncode == 1 and "--fail-at-step 27" in failed.stderr
    record = json.loads((failed_dir / "run.json").read_text())
    assert record["status"] == "failed" and record["parameters"]["gradient_accumulation_steps"] == 2
    assert [(c["step"], c["framework"], c["includes_optimizer"]) for c in record["checkpoints"]] == [
        (10, "transformers", True),
        (20, "transformers", True),
    ]
    parts = record["checkpoints"][1]["metadata"]["training_state"]["parts"]
    assert parts["optimizer"] == {"file": "optimizer.pt"} and parts["data_position"] == {"file": "trainer_state.json"}
    assert _steps(failed_dir, "train/loss") == list(range(1, 27))

    # the worker's extraction is read-only; the Trainer must only read it
    checkpoint = failed_dir / "checkpoints" / "step-20"
    for path in [*checkpoint.rglob("*"), checkpoint]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    before = _tree(checkpoint)
    resume = job_resume_variables(checkpoint, 20, tmp_path / "resume-checkpoint.json", source_run_id="failed")
    resumed = _example("--offline", *ARGS, "--output", str(resumed_dir / "w.safetensors"), env=resume)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {checkpoint}" in resumed.stdout
    assert _tree(checkpoint) == before
    assert _steps(resumed_dir, "train/loss") == list(range(21, 41))  # the Trainer went on at 21, not from scratch
    assert (resumed_dir / "w.safetensors").read_bytes() == uninterrupted


@pytest.mark.one_database  # on PostgreSQL: test_hf_trainer_flow.py, same-run resume in test_resume_anywhere_ddp.py
@pytest.mark.django_db(transaction=True)
def test_the_same_run_started_again_in_an_empty_directory_resumes_from_its_step_20_checkpoint(
    mmt_env, tmp_path, uninterrupted
):
    from checkpoints.models import Checkpoint
    from parity.models import RestoreReport
    from runs.models import MetricPoint, Run

    same_run = {**mmt_env, "MMT_RUN_ID": "hf-again"}
    (tmp_path / "first").mkdir()
    first = _example(*ARGS, "--fail-at-step", "27", env=same_run, cwd=tmp_path / "first")
    assert first.returncode == 1, first.stderr
    (tmp_path / "elsewhere").mkdir()
    weights = tmp_path / "elsewhere" / "w.safetensors"
    again = _example(
        *ARGS, "--output", str(weights), env={**same_run, "MMT_RESUME": "must"}, cwd=tmp_path / "elsewhere"
    )
    assert again.returncode == 0, again.stderr
    assert "resuming from " + str(tmp_path / "elsewhere" / ".mado" / "cache") in again.stdout
    assert weights.read_bytes() == uninterrupted
    run = Run.objects.get(external_id="hf-again")
    assert (run.status, run.resume_count) == ("finished", 1)
    assert list(Checkpoint.objects.filter(run=run).order_by("step").values_list("step", flat=True)) == [10, 20, 30, 40]
    steps = MetricPoint.objects.filter(run=run, key="train/loss").values_list("step", flat=True)
    assert sorted(set(steps)) == list(range(1, 41))  # one curve
    report = RestoreReport.objects.get(run=run)  # what the integration loaded: no "Resume ignored?"
    assert set(report.parts.values()) == {"restored"}, report.details
    assert Checkpoint.objects.get(pk=report.checkpoint_id).step == 20
    (segment,) = run.resume_segments.all()  # steps 20-27 trained again, compared with the first ones
    assert (segment.verdict, segment.checkpoint_step, segment.first_step) == ("identical", 20, 21), segment.key
    assert set(segment.restore_parts.values()) == {"restored"}


def test_training_parameters_are_json_with_the_model_config_under_model_and_no_paths_or_tokens(tmp_path):
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), learning_rate=3e-4, use_cpu=True, report_to="none", hub_token="secret"
    )
    model = BertForSequenceClassification(
        BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
    )
    model.config.layer_norm_eps = float("nan")
    parameters = training_parameters(args, model)
    json.dumps(parameters, allow_nan=False)
    assert parameters["learning_rate"] == 3e-4 and parameters["lr_scheduler_type"] == "linear"
    assert parameters["model.hidden_size"] == 8 and parameters["model.num_labels"] == 2
    assert parameters["model.layer_norm_eps"] == "nan"
    assert not {"output_dir", "hub_token", "report_to", "model.id2label", "model._name_or_path"} & set(parameters)
    assert "secret" not in json.dumps(parameters) and None not in parameters.values()
    assert training_parameters(args) == {k: v for k, v in parameters.items() if not k.startswith("model.")}


def test_logs_become_train_and_eval_metrics_at_the_global_step_and_text_is_left_out(tmp_path, caplog):
    callback = MadoCallback(offline=True, output=tmp_path / "run", kind="fine_tuning", parameters={"note": "x"})
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none")
    state = TrainerState(is_world_process_zero=True)
    state.global_step = 7
    handler = signal.getsignal(signal.SIGTERM)
    with caplog.at_level(logging.WARNING, logger="mado_tracking"):
        callback.on_log(args, state, None, logs={"loss": 0.5, "learning_rate": 1e-3, "epoch": 0.25})
        callback.on_log(args, state, None, logs={"eval_loss": 0.25, "eval_runtime": 0.1, "note": "text"})
        callback.on_log(args, state, None, logs={"note": "again"})
    state.is_world_process_zero = False
    callback.on_log(args, state, None, logs={"loss": 9.0})  # another process: nothing
    assert signal.getsignal(signal.SIGTERM) is handler  # logging alone (an evaluation) leaves the signals alone
    callback.run.finish()
    points = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {(p["key"], p["step"], p["value"]) for p in points} == {
        ("train/loss", 7, 0.5),
        ("train/learning_rate", 7, 1e-3),
        ("train/epoch", 7, 0.25),
        ("eval/loss", 7, 0.25),
        ("eval/runtime", 7, 0.1),
    }
    assert caplog.text.count("'note' is not a number") == 1
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["kind"] == "fine_tuning" and record["parameters"]["note"] == "x"
    assert record["parameters"]["per_device_train_batch_size"] == 8


def test_resume_from_checkpoint_is_none_unless_resuming_and_refuses_what_the_trainer_could_not_resume(
    tmp_path, monkeypatch
):
    assert resume_from_checkpoint() is None
    checkpoint, info = tmp_path / "ckpt", tmp_path / "info.json"
    checkpoint.mkdir()
    (checkpoint / "model.pt").write_bytes(b"w")
    set_job_resume_variables(monkeypatch, checkpoint, 20, info, checkpoint_id=3, source_run_id="r")
    with pytest.raises(mado_tracking.ResumeError, match="not a Hugging Face Trainer checkpoint"):
        resume_from_checkpoint()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 30}))
    with pytest.raises(mado_tracking.ResumeError, match="at step 20 but its trainer_state.json says global step 30"):
        resume_from_checkpoint()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 20}))
    assert resume_from_checkpoint() == str(checkpoint)


def test_wrong_arguments_are_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        MadoCallback(kind="pretraining")
    with mado_tracking.start_run(offline=True, output=tmp_path / "run") as run:
        with pytest.raises(ValueError, match="project, name belong to start_run"):
            MadoCallback(run, project="nlp", name="x")

    class NoMado:
        callback_handler = type("Handler", (), {"callbacks": []})()

    with pytest.raises(ValueError, match="no MadoCallback"):
        resume_from_checkpoint(NoMado())


def test_a_save_on_a_stop_signal_that_cannot_be_logged_says_why_and_still_exits_preempted(tmp_path, caplog):
    from mado_tracking.preemption import Preemption

    checkpoint = tmp_path / "out" / "checkpoint-5"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text('{"global_step": 5}')
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none")
    state = TrainerState(is_world_process_zero=True)
    state.global_step = 5
    with caplog.at_level(logging.ERROR, logger="mado_tracking"), pytest.raises(SystemExit) as exited:
        with mado_tracking.start_run(offline=True, output=tmp_path / "run") as run:
            run.log_checkpoint(checkpoint, step=5)  # the step is taken: the callback's save is refused
            callback = MadoCallback(run)
            callback._stop, callback._stopping = Preemption(run), True
            callback._stop._record(signal.SIGTERM)
            callback.on_save(args, state, None)
    assert exited.value.code == 128 + signal.SIGTERM
    assert "the checkpoint saved on SIGTERM was not uploaded" in caplog.text and "already saved" in caplog.text
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "preempted"


def test_training_state_lists_the_parts_a_distributed_checkpoint_holds(tmp_path):
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state_0.pth", "rng_state_1.pth"):
        (tmp_path / name).write_bytes(b"x")
    state = training_state(tmp_path, 30)["training_state"]
    assert state["global_step"] == 30
    assert state["parts"]["rng.python"] == {"files": ["rng_state_0.pth", "rng_state_1.pth"]}
    assert "scaler" not in state["parts"] and "data_position" not in state["parts"]


def _sigterm_after_the_first_log(argv: list[str], env: dict, cwd: Path, *, one_child: bool = False):
    """Start ``argv`` in a process group of its own; once the Trainer printed its first logged step, SIGTERM the
    group (as a Job's runner does), or with ``one_child`` only one of its child processes; return it ended."""

    def send(child: subprocess.Popen) -> None:
        if one_child:
            children = Path(f"/proc/{child.pid}/task/{child.pid}/children").read_text().split()
            os.kill(int(children[-1]), signal.SIGTERM)
        else:
            os.killpg(child.pid, signal.SIGTERM)

    # the Trainer prints one line per logged step
    env = {**env, "HF_HUB_OFFLINE": "1"}
    return signal_once_ready(argv, env=env, cwd=cwd, ready="{'loss'", new_session=True, send=send)


def _preempted_checkpoint(name: str, env: dict):
    """The one Checkpoint of Run ``name``, asserted complete, saved on SIGTERM at its global step, the Run preempted;
    returns ``(row, API resource)``."""
    from checkpoints.models import Checkpoint
    from runs.models import Run, RunStatus

    run = Run.objects.get(name=name)
    assert run.status == RunStatus.PREEMPTED
    checkpoint = Checkpoint.objects.get(run=run)
    state = checkpoint.metadata["training_state"]
    assert checkpoint.state == "complete" and 1 <= checkpoint.step == state["global_step"] < 100
    assert checkpoint.framework == "transformers" and checkpoint.includes_optimizer
    assert checkpoint.metadata["preemption"]["signal"] == "SIGTERM"
    resource = requests.get(
        f"{env['MMT_API_URL']}/api/v1/checkpoints/{checkpoint.pk}/",
        headers={"Authorization": f"Bearer {env['MMT_API_TOKEN']}"},
        timeout=10,
    ).json()
    assert 0 <= resource["signal_to_complete_s"] < 60
    return checkpoint, resource


@pytest.mark.one_database  # the process stops itself; the database only records it
@pytest.mark.django_db(transaction=True)
def test_sigterm_mid_training_saves_a_complete_checkpoint_and_the_run_ends_preempted(mmt_env, tmp_path):
    argv = [sys.executable, str(EXAMPLE), "--steps", "100000", "--checkpoint-every", "0", "--name", "sigterm"]
    child = _sigterm_after_the_first_log(argv, mmt_env, tmp_path)
    assert child.returncode == 128 + signal.SIGTERM, child.stderr
    _, resource = _preempted_checkpoint("sigterm", mmt_env)
    assert {"trainer_state.json", "optimizer.pt", "rng_state.pth"} <= {entry["path"] for entry in resource["manifest"]}


@pytest.mark.one_database  # the ranks stop themselves; the database only records it
@pytest.mark.django_db(transaction=True)
def test_under_torchrun_sigterm_to_one_rank_stops_both_at_one_step_with_each_ranks_random_state(mmt_env, tmp_path):
    from tests.deployment import free_port

    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port"]
    argv = [*torchrun, str(free_port()), str(EXAMPLE), "--steps", "100000", "--checkpoint-every", "0"]
    child = _sigterm_after_the_first_log([*argv, "--name", "ddp"], mmt_env, tmp_path, one_child=True)
    saving = re.findall(r"SIGTERM received: saving checkpoint-(\d+)", child.stderr)
    assert len(saving) == 2 and saving[0] == saving[1], child.stderr  # the rank not signalled stops at the same step
    checkpoint, resource = _preempted_checkpoint("ddp", mmt_env)
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {entry["path"] for entry in resource["manifest"]}
    assert checkpoint.metadata["training_state"]["parts"]["rng.torch"] == {
        "files": ["rng_state_0.pth", "rng_state_1.pth"]
    }
