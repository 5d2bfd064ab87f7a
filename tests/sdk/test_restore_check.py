"""A resumed run says what it did not restore from its checkpoint before its first step: a WARNING line and
``POST runs/{id}/restore-report/`` at the load, updated at the first ``log_metrics`` for what changed after the load
(docs/design/checkpoints.md#restore-check, #training-state)."""

import json
import logging
import random

import pytest
import torch

import mado_tracking
from mado_tracking import restore_check
from mado_tracking.torch import load_checkpoint, load_data_position, save_checkpoint
from tests.sdk.stub_api import StubApi

pytestmark = pytest.mark.usefixtures("fresh_restore_check")

CHECKPOINT_ID = 7


class Position:
    """A data position: epoch and index, as a sampler keeps them."""

    def __init__(self):
        self.epoch, self.index = 0, 0

    def state_dict(self):
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state):
        self.epoch, self.index = state["epoch"], state["index"]


def _objects(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9**step)
    return model, optimizer, scheduler, torch.Generator().manual_seed(seed), Position()


def _step(model, optimizer, scheduler, generator, position) -> float:
    loss = model(torch.randn(4, 3, generator=generator) + torch.rand(1)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    position.index += 4
    return loss.item()


@pytest.fixture
def saved(tmp_path, monkeypatch):
    """A checkpoint after 3 steps, and the ``MMT_RESUME_*`` variables of a Job resuming from it."""
    model, optimizer, scheduler, generator, position = _objects()
    for _ in range(3):
        _step(model, optimizer, scheduler, generator, position)
    directory = tmp_path / "ckpt"
    save_checkpoint(
        directory,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        step=3,
        generators={"batches": generator},
        data_position=position,
    )
    info = tmp_path / "resume-checkpoint.json"
    info.write_text(json.dumps({"checkpointId": CHECKPOINT_ID, "sourceRunId": 1, "step": 3}))
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_DIR", str(directory))
    monkeypatch.setenv("MMT_RESUME_STEP", "3")
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_FILE", str(info))
    return directory


def _start(stub: StubApi):
    return mado_tracking.start_run(project="vision", api_url=stub.url, api_token="stub-token")


def _not_restored(report: dict) -> list[str]:
    return sorted(part for part, status in report["parts"].items() if status == "not_restored")


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "WARNING: not restored" in r.getMessage()]


def test_a_complete_restore_reports_every_part_restored_once_and_warns_nothing(saved, caplog):
    with StubApi() as stub, caplog.at_level(logging.WARNING, logger="mado_tracking"), _start(stub) as run:
        model, optimizer, scheduler, generator, position = _objects(seed=1)
        step = load_checkpoint(
            saved,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            generators={"batches": generator},
            data_position=position,
        )
        for at in range(step, step + 2):
            run.log_metrics({"loss": _step(model, optimizer, scheduler, generator, position)}, step=at)
    [report] = stub.restore_reports  # unchanged at the first metrics: not sent again
    assert report["checkpoint_id"] == CHECKPOINT_ID
    assert set(report["parts"]) >= {"model", "optimizer", "scheduler", "rng.python", "rng.numpy", "rng.torch"}
    assert set(report["parts"]) >= {"generator.batches", "data_position", "global_step"}
    assert set(report["parts"].values()) == {"restored"} and report["details"] == {}
    assert _warnings(caplog) == []


def test_parts_left_out_of_the_load_are_reported_and_warned_about_at_the_load(saved, caplog):
    with StubApi() as stub, caplog.at_level(logging.WARNING, logger="mado_tracking"), _start(stub):
        model, optimizer, scheduler, generator, position = _objects(seed=1)
        load_checkpoint(saved, model=model, optimizer=optimizer, restore_rng=False)
        assert len(stub.restore_reports) == 1  # before any metrics
    report = stub.restore_reports[0]
    assert _not_restored(report) == sorted(
        ["scheduler", "data_position", "generator.batches", "rng.python", "rng.numpy", "rng.torch"]
    )
    assert report["parts"]["model"] == report["parts"]["optimizer"] == "restored"
    assert "load_checkpoint was given no scheduler" in report["details"]["scheduler"]
    assert report["details"]["rng.torch"] == "load_checkpoint(restore_rng=False)"
    [warning] = _warnings(caplog)
    assert f"not restored from checkpoint {CHECKPOINT_ID} (step 3): " in warning
    assert "scheduler — the checkpoint holds a scheduler state" in warning and "generator.batches" in warning


@pytest.mark.parametrize(
    ("after_load", "part", "detail"),
    [
        ("rebuild_scheduler", "scheduler", "dropped before the first metrics"),
        ("reseed_torch", "rng.torch", "re-seeded with 0 after load"),
        ("new_generator", "generator.batches", "dropped before the first metrics"),
        ("restart_data", "data_position", "went back from 0, 12 at the load to 0, 4"),
        ("restart_steps", "global_step", "the first metrics are at step 0, below the checkpoint's step 3"),
    ],
)
def test_what_changes_after_the_load_is_reported_at_the_first_metrics_before_they_are_sent(
    saved, caplog, after_load, part, detail
):
    with StubApi() as stub, caplog.at_level(logging.WARNING, logger="mado_tracking"), _start(stub) as run:
        model, optimizer, scheduler, generator, position = _objects(seed=1)
        load_checkpoint(
            saved,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            generators={"batches": generator},
            data_position=position,
        )
        first = 3
        if after_load == "rebuild_scheduler":
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9**step)
        elif after_load == "reseed_torch":
            torch.manual_seed(0)
        elif after_load == "new_generator":
            generator = torch.Generator().manual_seed(0)
        elif after_load == "restart_data":
            position.index = 0
        else:
            first = 0
        run.log_metrics({"loss": _step(model, optimizer, scheduler, generator, position)}, step=first)
        run.log_metrics({"loss": _step(model, optimizer, scheduler, generator, position)}, step=first + 1)
    assert [_not_restored(report) for report in stub.restore_reports] == [[], [part]]
    assert detail in stub.restore_reports[1]["details"][part]
    assert stub.events.index("restore-report", 1) < stub.events.index("metrics")
    [warning] = _warnings(caplog)
    assert f" {part} — " in warning


def test_random_numbers_drawn_after_the_load_are_no_restore_failure(saved, caplog):
    with StubApi() as stub, caplog.at_level(logging.WARNING, logger="mado_tracking"), _start(stub) as run:
        model, optimizer, scheduler, generator, position = _objects(seed=1)
        load_checkpoint(saved, model=model, optimizer=optimizer, scheduler=scheduler, generators={"batches": generator})
        random.random(), torch.rand(5000), torch.rand(70000, generator=generator)  # past a twist of each
        run.log_metrics({"loss": _step(model, optimizer, scheduler, generator, position)}, step=3)
    assert [_not_restored(report) for report in stub.restore_reports] == [["data_position"]]
    assert len(_warnings(caplog)) == 1


def test_a_data_position_read_with_load_data_position_counts_as_restored(saved):
    with StubApi() as stub, _start(stub) as run:
        model, optimizer, scheduler, generator, _position = _objects(seed=1)
        load_checkpoint(saved, model=model, optimizer=optimizer, scheduler=scheduler, generators={"batches": generator})
        assert load_data_position(saved) == {"epoch": 0, "index": 12}
        run.log_metrics({"loss": 1.0}, step=3)
    assert [_not_restored(report) for report in stub.restore_reports] == [["data_position"], []]


def test_a_load_before_the_run_starts_is_reported_at_its_first_metrics(saved):
    model, optimizer, _scheduler, _generator, _position = _objects(seed=1)
    load_checkpoint(saved, model=model, optimizer=optimizer)
    with StubApi() as stub, _start(stub) as run:
        assert stub.restore_reports == []
        run.log_metrics({"loss": 1.0}, step=3)
    [report] = stub.restore_reports
    assert "scheduler" in _not_restored(report)


def test_a_process_that_is_not_resuming_reports_and_warns_nothing(saved, monkeypatch, caplog):
    for name in ("MMT_RESUME_CHECKPOINT_DIR", "MMT_RESUME_STEP", "MMT_RESUME_CHECKPOINT_FILE"):
        monkeypatch.delenv(name)
    with StubApi() as stub, caplog.at_level(logging.WARNING, logger="mado_tracking"), _start(stub) as run:
        model, optimizer, *_ = _objects(seed=1)
        load_checkpoint(saved, model=model, optimizer=optimizer)  # e.g. fine-tuning from saved weights
        run.log_metrics({"loss": 1.0}, step=0)
    assert stub.restore_reports == [] and caplog.records == []


def test_a_server_without_restore_reports_leaves_training_alone(saved, caplog):
    with StubApi() as stub, caplog.at_level(logging.INFO, logger="mado_tracking"), _start(stub) as run:
        stub.refuse_reports = True
        model, optimizer, *_ = _objects(seed=1)
        load_checkpoint(saved, model=model, optimizer=optimizer)
        torch.manual_seed(5)
        run.log_metrics({"loss": 1.0}, step=3)
    assert stub.restore_reports == [] and [p["step"] for p in stub.points] == [3]
    assert not [r for r in caplog.records if "was not sent" in r.getMessage()]
    assert len(_warnings(caplog)) == 2  # the load's, then the first metrics' (rng.torch) in the process output


def test_a_resumed_run_that_loads_nothing_is_warned_once_and_reports_nothing(saved, caplog):
    with StubApi() as stub, caplog.at_level(logging.WARNING, logger="mado_tracking"), _start(stub) as run:
        for step in (3, 4):
            run.log_metrics({"loss": 1.0}, step=step)
    assert stub.restore_reports == []
    [warning] = [r.getMessage() for r in caplog.records]
    assert f"resumes from checkpoint {CHECKPOINT_ID} (step 3) but loaded no checkpoint" in warning


def test_offline_the_restore_check_warns_and_sends_nothing(saved, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="mado_tracking"):
        with mado_tracking.start_run(offline=True, output=tmp_path / "offline") as run:
            model, optimizer, *_ = _objects(seed=1)
            load_checkpoint(saved, model=model, optimizer=optimizer)
            run.log_metrics({"loss": 1.0}, step=3)
    [warning] = _warnings(caplog)
    assert "scheduler" in warning


def test_an_unknown_status_is_refused():
    with pytest.raises(ValueError, match="restore status of 'model' must be one of"):
        restore_check.after_load(directory=".", step=0, parts={"model": ("done", "")})


def test_the_report_body_keeps_to_what_the_server_takes():
    parts = {f"generator.g{i}": ("restored", "") for i in range(200)}
    parts["generator.my gen/1"] = ("not_restored", "line one\nline two " + "x" * 600)
    body = restore_check.RestoreCheck(directory=".", step=3, checkpoint_id=None, parts=parts).body()
    assert len(body["parts"]) == restore_check.PARTS_MAX
    assert body["parts"]["generator.my_gen_1"] == "not_restored"
    detail = body["details"]["generator.my_gen_1"]
    assert len(detail) == restore_check.DETAIL_MAX and "\n" not in detail and detail.startswith("line one line two")


def test_the_sdk_draws_nothing_from_the_training_codes_python_rng():
    random.seed(11)
    before = random.getstate()
    with StubApi(fail_metrics=1) as stub, _start(stub) as run:  # a retried post: a backoff wait is drawn too
        for step in range(3):
            run.log_metrics({"loss": 1.0}, step=step)
    assert len(stub.points) == 3
    assert random.getstate() == before  # a resumed run's restored state is not moved by the SDK's threads
