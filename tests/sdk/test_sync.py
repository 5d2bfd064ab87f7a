"""``mado sync DIR`` uploads an offline run (docs/design/runs.md#offline) without losing or duplicating a point:
twice in a row, after a sync killed half-way, and again after the offline run grew."""

import json
from collections import Counter

import pytest
from click.testing import CliRunner

import mado_tracking
from checkpoints.models import Checkpoint, CheckpointState
from mado_tracking import checkpoints as checkpoints_module
from mado_tracking import config as config_module
from mado_tracking import sync as sync_module
from mado_tracking.cli import main
from runs.models import MetricPoint, Run, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)

POINTS = 23  # steps, two keys each: 46 lines, several batches of 10


@pytest.fixture
def offline_run(tmp_path):
    """A finished offline run: 46 metric lines, checkpoints at steps 10 and 20."""
    out = tmp_path / "offline"
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with mado_tracking.start_run("vision", name="offline", parameters={"lr": 0.1}, offline=True, output=out) as run:
        for step in range(POINTS):
            run.log_metrics({"loss": 1.0 / (step + 1), "acc/精度": step / 100}, step=step)
            if step in (10, 20):
                (ckpt / "model.pt").write_bytes(f"weights at {step}".encode() * 100)
                run.log_checkpoint(ckpt, step=step, includes_optimizer=True, framework="torch")
    return out, run.external_id


def _config(mmt_env) -> config_module.Config:
    return config_module.resolve(
        api_url=mmt_env["MMT_API_URL"], api_token=mmt_env["MMT_API_TOKEN"], require_project=False
    )


def _stored(run_id: int) -> Counter:
    return Counter(MetricPoint.objects.filter(run_id=run_id).values_list("key", "step"))


def _expected() -> Counter:
    return Counter([(key, step) for step in range(POINTS) for key in ("loss", "acc/精度")])


def test_a_sync_creates_the_run_with_its_metrics_checkpoints_and_status(mmt_env, offline_run):
    out, external_id = offline_run
    report = sync_module.sync_offline_run(out, _config(mmt_env), batch_max=10)
    run = Run.objects.get()
    assert report.created and report.run["id"] == run.pk
    assert (run.external_id, run.name, run.parameters, run.status) == (
        external_id,
        "offline",
        {"lr": 0.1},
        RunStatus.FINISHED,
    )
    assert run.project.slug == "vision"
    assert _stored(run.pk) == _expected()
    assert MetricPoint.objects.get(run=run, key="loss", step=3).value == 0.25
    stored = Checkpoint.objects.filter(run=run).order_by("step")
    assert [(c.step, c.state, c.framework, c.includes_optimizer) for c in stored] == [
        (10, CheckpointState.COMPLETE, "torch", True),
        (20, CheckpointState.COMPLETE, "torch", True),
    ]
    record = json.loads((out / "run.json").read_text())
    assert [c.tar_sha256 for c in stored] == [c["tar_sha256"] for c in record["checkpoints"]]
    assert (report.points_sent, report.checkpoints_uploaded) == (2 * POINTS, [10, 20])


def test_syncing_twice_adds_nothing(mmt_env, offline_run):
    out, _ = offline_run
    sync_module.sync_offline_run(out, _config(mmt_env), batch_max=10)
    (out / sync_module.STATE_FILE).unlink()  # even without its memory, the batch keys make every batch a no-op
    again = sync_module.sync_offline_run(out, _config(mmt_env), batch_max=10)
    run = Run.objects.get()
    assert not again.created and again.points_sent == 0
    assert again.checkpoints_uploaded == [] and again.checkpoints_present == [10, 20]
    assert _stored(run.pk) == _expected()
    assert Checkpoint.objects.count() == 2


def test_a_sync_killed_between_a_stored_batch_and_its_bookkeeping_loses_and_duplicates_nothing(
    mmt_env, offline_run, monkeypatch
):
    out, _ = offline_run
    writes = []
    original = sync_module.write_json_atomically

    def die_on_the_third_write(path, data):
        writes.append(path)
        if len(writes) == 3:
            raise KeyboardInterrupt  # killed after the server stored batch 3, before the state file says so
        original(path, data)

    monkeypatch.setattr(sync_module, "write_json_atomically", die_on_the_third_write)
    with pytest.raises(KeyboardInterrupt):
        sync_module.sync_offline_run(out, _config(mmt_env), batch_max=10)
    run = Run.objects.get()
    assert sum(_stored(run.pk).values()) == 30 and run.status == RunStatus.RUNNING
    monkeypatch.setattr(sync_module, "write_json_atomically", original)
    sync_module.sync_offline_run(out, _config(mmt_env), batch_max=10)
    assert _stored(run.pk) == _expected()
    assert Run.objects.get().status == RunStatus.FINISHED


def test_a_sync_killed_during_a_checkpoint_upload_finishes_it_next_time(mmt_env, offline_run, monkeypatch):
    out, _ = offline_run
    upload = checkpoints_module._ServerUpload.run

    def killed_for_step_20(self, tar):
        if self.step == 20:
            raise KeyboardInterrupt
        return upload(self, tar)

    monkeypatch.setattr(checkpoints_module._ServerUpload, "run", killed_for_step_20)
    with pytest.raises(KeyboardInterrupt):
        sync_module.sync_offline_run(out, _config(mmt_env))
    assert dict(Checkpoint.objects.values_list("step", "state")) == {10: "complete", 20: "pending"}
    monkeypatch.setattr(checkpoints_module._ServerUpload, "run", upload)
    report = sync_module.sync_offline_run(out, _config(mmt_env))
    assert report.checkpoints_present == [10] and report.checkpoints_uploaded == [20]
    assert dict(Checkpoint.objects.values_list("step", "state")) == {10: "complete", 20: "complete"}
    assert _stored(Run.objects.get().pk) == _expected()


def test_a_run_still_writing_can_be_synced_again_as_it_grows(mmt_env, tmp_path):
    out = tmp_path / "growing"
    run = mado_tracking.start_run("vision", offline=True, output=out)
    for step in range(15):
        run.log_metrics({"loss": float(step)}, step=step)
    first = sync_module.sync_offline_run(out, _config(mmt_env), batch_max=10)
    assert first.status == "running"
    for step in range(15, 27):
        run.log_metrics({"loss": float(step)}, step=step)
    run.finish()
    sync_module.sync_offline_run(out, _config(mmt_env), batch_max=10)
    server_run = Run.objects.get()
    assert _stored(server_run.pk) == Counter(("loss", step) for step in range(27))
    assert server_run.status == RunStatus.FINISHED


def test_a_half_written_last_line_is_left_for_a_later_sync(mmt_env, tmp_path):
    out = tmp_path / "crashed"
    run = mado_tracking.start_run("vision", offline=True, output=out)
    run.log_metrics({"loss": 1.0}, step=0)
    with open(out / "metrics.jsonl", "a") as handle:
        handle.write('{"key":"loss","va')  # the process died mid-write
    report = sync_module.sync_offline_run(out, _config(mmt_env))
    assert report.points_total == 1 and sum(_stored(report.run["id"]).values()) == 1


def test_the_mado_sync_command_uploads_the_run_and_says_what_it_did(mmt_env, offline_run):
    out, external_id = offline_run
    result = CliRunner().invoke(main, ["sync", str(out)])
    assert result.exit_code == 0, result.output
    assert f"({external_id}) created: {2 * POINTS} new metric points of {2 * POINTS}" in result.output
    assert "checkpoints uploaded [10, 20]" in result.output and "status finished" in result.output
    again = CliRunner().invoke(main, ["sync", str(out)])
    assert again.exit_code == 0 and "found: 0 new metric points" in again.output
    assert _stored(Run.objects.get().pk) == _expected()


def test_sync_needs_a_project_and_an_offline_run_directory(mmt_env, tmp_path, monkeypatch):
    monkeypatch.delenv("MMT_PROJECT")
    with mado_tracking.start_run(offline=True, output=tmp_path / "noproject"):
        pass
    result = CliRunner().invoke(main, ["sync", str(tmp_path / "noproject")])
    assert result.exit_code != 0 and "no project" in result.output
    result = CliRunner().invoke(main, ["sync", str(tmp_path)])
    assert result.exit_code != 0 and "not an offline mado run" in result.output
    result = CliRunner().invoke(main, ["sync", str(tmp_path / "noproject"), "--project", "vision"])
    assert result.exit_code == 0, result.output
    assert Run.objects.get().project.slug == "vision"
