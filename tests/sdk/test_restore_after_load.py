"""The restore check looks again at the first optimizer step: a value a resumed program changes right after
``load_checkpoint`` is named, and a data position the checkpoint does not hold is "not declared" with the call that
declares it (docs/design/checkpoints.md#restore-check). Each test trains a small torch model on the CPU, saves a
checkpoint after 3 steps, and resumes from it as a Job's resumed process does (``MMT_RESUME_*``)."""

import json
import logging

import pytest
import torch

import mado_tracking
from mado_tracking import restore_check
from mado_tracking.errors import ApiError
from mado_tracking.torch import load_checkpoint, load_extra, save_checkpoint
from tests.sdk.data_position import Position
from tests.sdk.stub_api import StubApi

pytestmark = pytest.mark.usefixtures("fresh_restore_check")

CHECKPOINT_ID = 7
BATCH = 4


class Loop:
    """A tiny regression model (with batch norm, whose statistics a forward pass moves), momentum SGD, a decaying
    learning rate and a generator that draws the data, trained one batch a step."""

    def __init__(self, *, scheduler: bool = True, scheduler_first: bool = False):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.scheduler = (
            torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 0.9**step) if scheduler else None
        )
        self.scheduler_first = scheduler_first
        self.generator = torch.Generator().manual_seed(1)
        self.data = torch.randn(64, 4, generator=self.generator)
        self.position = Position()

    def step(self) -> float:
        if self.scheduler is not None and self.scheduler_first:
            self.scheduler.step()
        batch = self.data[self.position.index : self.position.index + BATCH]
        loss = (self.model(batch) - batch.sum(dim=1, keepdim=True)).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        if self.scheduler is not None and not self.scheduler_first:
            self.scheduler.step()
        self.position.index += BATCH
        return loss.item()

    def save(self, directory, *, declared: bool = True) -> None:
        save_checkpoint(
            directory,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            step=3,
            generators={"batches": self.generator},
            data_position=self.position if declared else None,
            extra=None if declared else {"next_index": self.position.index},
        )

    def load(self, directory, *, declared: bool = True) -> int:
        step = load_checkpoint(
            directory,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            generators={"batches": self.generator},
            data_position=self.position if declared else None,
        )
        if not declared:
            self.position.index = load_extra(directory)["next_index"]
        return step


def _checkpoint(tmp_path, monkeypatch, **loop) -> object:
    """Train 3 steps, save, and set the ``MMT_RESUME_*`` variables of a Job resuming from that checkpoint."""
    declared = loop.pop("declared", True)
    trained = Loop(**loop)
    for _ in range(3):
        trained.step()
    directory = tmp_path / "ckpt"
    trained.save(directory, declared=declared)
    info = tmp_path / "resume-checkpoint.json"
    info.write_text(json.dumps({"checkpointId": CHECKPOINT_ID, "sourceRunId": 1, "step": 3}))
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_DIR", str(directory))
    monkeypatch.setenv("MMT_RESUME_STEP", "3")
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_FILE", str(info))
    return directory


def _resume(directory, *, after_load=None, declared: bool = True, metrics_first: bool = False, **loop) -> StubApi:
    """Resume in a new process's objects, run ``after_load(loop)``, train 3 steps logging each; the stub's reports."""
    with StubApi() as stub, mado_tracking.start_run(project="vision", api_url=stub.url, api_token="stub-token") as run:
        resumed = Loop(**loop)
        start = resumed.load(directory, declared=declared)
        if after_load is not None:
            after_load(resumed)
        if metrics_first:
            run.log_metrics({"eval.loss": 1.0}, step=start)
        for step in range(start, start + 3):
            run.log_metrics({"train.loss": resumed.step()}, step=step)
    return stub


def _statuses(report: dict) -> dict:
    return {part: status for part, status in report["parts"].items() if status != "restored"}


def _set_lr(loop: Loop) -> None:
    for group in loop.optimizer.param_groups:
        group["lr"] = 0.5


def test_the_documented_path_reports_everything_restored(tmp_path, monkeypatch, caplog):
    directory = _checkpoint(tmp_path, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="mado_tracking"):
        stub = _resume(directory)
    [report] = stub.restore_reports  # unchanged at the first optimizer step and the first metrics: sent once
    assert set(report["parts"]) >= {"model", "optimizer", "scheduler", "data_position", "generator.batches"}
    assert _statuses(report) == {} and report["details"] == {}
    assert not [r for r in caplog.records if "WARNING" in r.getMessage()]


@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler.step\(\)` before")
def test_a_scheduler_stepped_before_the_optimizer_in_every_step_is_no_change(tmp_path, monkeypatch):
    directory = _checkpoint(tmp_path, monkeypatch, scheduler_first=True)
    stub = _resume(directory, scheduler_first=True)
    assert [_statuses(report) for report in stub.restore_reports] == [{}]


def test_an_lr_overwritten_right_after_the_load_is_named_although_the_scheduler_sets_it_back(
    tmp_path, monkeypatch, caplog
):
    directory = _checkpoint(tmp_path, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="mado_tracking"):
        stub = _resume(directory, after_load=_set_lr)
    assert [_statuses(report) for report in stub.restore_reports] == [{}, {"optimizer": "not_restored"}]
    assert stub.restore_reports[1]["details"]["optimizer"] == (
        "param group 0: lr 0.03645 at the load, 0.5 at the first optimizer step: set after load_checkpoint, "
        "not by the restored scheduler (its lr: 0.03645)"
    )
    assert stub.events.index("restore-report", 1) < stub.events.index("metrics")
    [warning] = [r.getMessage() for r in caplog.records if "not restored" in r.getMessage()]
    assert "optimizer — param group 0: lr 0.03645 at the load, 0.5 at the first optimizer step" in warning


def test_an_lr_overwritten_before_metrics_that_come_first_is_named_at_those_metrics(tmp_path, monkeypatch):
    directory = _checkpoint(tmp_path, monkeypatch)
    stub = _resume(directory, after_load=_set_lr, metrics_first=True)
    detail = stub.restore_reports[-1]["details"]["optimizer"]
    assert detail.startswith("param group 0: lr 0.03645 at the load, 0.5 at the first metrics (no optimizer step")


def test_without_a_scheduler_an_lr_set_after_the_load_is_named_as_unknown(tmp_path, monkeypatch):
    directory = _checkpoint(tmp_path, monkeypatch, scheduler=False)
    stub = _resume(directory, after_load=_set_lr, scheduler=False)
    assert _statuses(stub.restore_reports[-1]) == {"optimizer": "unknown"}
    assert stub.restore_reports[-1]["details"]["optimizer"] == (
        "param group 0: lr 0.05 at the load, 0.5 at the first optimizer step "
        "(set after load_checkpoint: a schedule of the program's own?)"
    )


def test_weights_initialized_again_after_the_load_are_named(tmp_path, monkeypatch):
    directory = _checkpoint(tmp_path, monkeypatch)
    stub = _resume(directory, after_load=lambda loop: torch.nn.init.zeros_(loop.model[2].weight))
    assert _statuses(stub.restore_reports[-1]) == {"model": "not_restored"}
    assert stub.restore_reports[-1]["details"]["model"] == (
        "parameter 2.weight changed after load_checkpoint, before the first optimizer step "
        "(initialized or loaded again after the load?)"
    )


def test_a_data_position_kept_in_extra_is_reported_not_declared_with_the_call_that_declares_it(
    tmp_path, monkeypatch, caplog
):
    directory = _checkpoint(tmp_path, monkeypatch, declared=False)
    with caplog.at_level(logging.WARNING, logger="mado_tracking"):
        stub = _resume(directory, declared=False)
    [report] = stub.restore_reports
    assert _statuses(report) == {"data_position": "not_declared"}
    assert report["details"]["data_position"] == (
        "the checkpoint declares no data position, so where the data resumes is not checked; if extra.pt keeps it, "
        "mado cannot read it there: declare it with save_checkpoint(..., data_position=<sampler, loader or value>) "
        "and load it with load_checkpoint(..., data_position=...) or load_data_position()"
    )
    [warning] = [r.getMessage() for r in caplog.records if "WARNING" in r.getMessage()]
    assert warning.startswith(f"mado: WARNING: not declared in checkpoint {CHECKPOINT_ID} (step 3): data_position — ")


class _OldServer:
    """A client whose server predates ``not_declared``: it refuses the status, naming the part."""

    def __init__(self):
        self.bodies = []

    def request(self, method, path, *, body, attempts):
        self.bodies.append(body)
        if "not_declared" in body["parts"].values():
            raise ApiError("refused", status=400, field="parts.data_position")


def test_a_server_that_predates_not_declared_gets_those_parts_as_unknown():
    check = restore_check.RestoreCheck(
        directory=".",
        step=3,
        checkpoint_id=None,
        parts={"model": ("restored", ""), "data_position": ("not_declared", "x")},
    )
    run = type("Run", (), {"id": 1, "_client": _OldServer()})()
    restore_check._send(check, run)
    assert [body["parts"]["data_position"] for body in run._client.bodies] == ["not_declared", "unknown"]
    assert run._client.bodies[1]["details"] == {"data_position": "x"} and check.sent is not None
