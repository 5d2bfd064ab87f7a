"""A continue with ``--param lr=0.02`` run by a real torch program through the SDK (docs/design/resume.md
#declared-changes): a tiny model trains 6 steps at lr 0.05 with a checkpoint after 3; the continued program builds
its optimizer with the new lr and loads the checkpoint, whose restored optimizer and LambdaLR scheduler put the old
rate back, or sets the new lr after the load without a scheduler. What its SDK sent (points and restore report, caught
by a stub server) is stored on the continued Run, and the verdict says which happened."""

import json
import os

import pytest

torch = pytest.importorskip("torch")

import mado_tracking  # noqa: E402
from jobs import services as job_services  # noqa: E402
from mado_tracking import _base, restore_check  # noqa: E402
from mado_tracking.torch import load_checkpoint, save_checkpoint  # noqa: E402
from parity import selectors  # noqa: E402
from parity.services import restore_report_record  # noqa: E402
from tests.jobs.conftest import (  # noqa: E402, F401
    celery_calls,
    checkpoint,
    code_version,
    cpu,
    dataset_versions,
    failed_job,
)
from tests.sdk.stub_api import StubApi  # noqa: E402

pytestmark = pytest.mark.django_db

OLD, NEW = 0.05, 0.02
SAVED_AT, STEPS = 3, 6


class Loop:
    """A linear model, SGD and (optionally) a LambdaLR scheduler, one fixed batch per step; ``step`` logs the lr the
    optimizer ran at."""

    def __init__(self, *, lr: float, scheduler: bool):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 0.9**s) if scheduler else None
        self.data = torch.randn(STEPS * 4, 4, generator=torch.Generator().manual_seed(1))

    def step(self, step: int) -> dict[str, float]:
        batch = self.data[step * 4 : step * 4 + 4]
        loss = (self.model(batch) - batch.sum(dim=1, keepdim=True)).pow(2).mean()
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        return {"train.loss": loss.item(), "train.lr": lr}


@pytest.fixture(autouse=True)
def _sdk_alone(monkeypatch, tmp_path):
    """No ``MMT_*`` of the shell, no Run or pending check an earlier test left open; the SDK's files in tmp_path."""
    for name in [name for name in os.environ if name.startswith("MMT_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    left_open = set(_base._open_runs)
    _base._open_runs.clear()
    restore_check.reset()
    yield
    restore_check.reset()
    _base._open_runs.update(left_open)


def _ingest(log, run, points: list[dict]) -> None:
    for key in sorted({point["key"] for point in points}):
        values = {point["step"]: point["value"] for point in points if point["key"] == key}
        log(run, sorted(values), keys=(key,), value=lambda _key, step, values=values: values[step])


@pytest.fixture
def continue_with_new_lr(tmp_path, monkeypatch, log, creator, failed_job, code_version, cpu):
    """``continue_with_new_lr(scheduler=bool, set_after_load=bool)``: train the parent (logged on ``failed_job``'s
    Run), continue it with lr 0.02 under the SDK, store what the SDK sent on the continued Run; its
    ``DeclaredVerdict``."""

    def continued(*, scheduler: bool, set_after_load: bool):
        return _declared(
            scheduler=scheduler,
            set_after_load=set_after_load,
            tmp_path=tmp_path,
            monkeypatch=monkeypatch,
            log=log,
            creator=creator,
            failed_job=failed_job,
            code_version=code_version,
            queue=cpu,
        )

    return continued


def _declared(*, scheduler: bool, set_after_load: bool, tmp_path, monkeypatch, log, creator, failed_job, **job):
    parent = Loop(lr=OLD, scheduler=scheduler)
    logged = []
    for step in range(STEPS):
        if step == SAVED_AT:
            saved = {"model": parent.model, "optimizer": parent.optimizer, "scheduler": parent.scheduler}
            save_checkpoint(tmp_path / "ckpt", **saved, step=SAVED_AT)
        logged += [{"key": k, "step": step, "value": v} for k, v in parent.step(step).items()]
    failed_job.run.parameters = {"lr": OLD}
    failed_job.run.save(update_fields=["parameters"])
    _ingest(log, failed_job.run, logged)
    continued = job_services.run_continue_from_checkpoint(
        actor=creator,
        checkpoint=checkpoint(failed_job.run, SAVED_AT),
        parameters={**failed_job.run.parameters, "lr": NEW},
        dataset_version_ids=[],
        **job,
    ).run
    info = tmp_path / "resume-checkpoint.json"
    info.write_text(json.dumps({"checkpointId": 7, "sourceRunId": failed_job.run_id, "step": SAVED_AT}))
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("MMT_RESUME_STEP", str(SAVED_AT))
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_FILE", str(info))
    with StubApi() as stub, mado_tracking.start_run(project="vision", api_url=stub.url, api_token="stub-token") as run:
        lr = continued.parameters["lr"]  # what the program reads: run.parameters["lr"]
        resumed = Loop(lr=OLD if set_after_load else lr, scheduler=scheduler)
        start = load_checkpoint(
            tmp_path / "ckpt", model=resumed.model, optimizer=resumed.optimizer, scheduler=resumed.scheduler
        )
        if set_after_load:
            for group in resumed.optimizer.param_groups:
                group["lr"] = lr
        for step in range(start, STEPS):
            run.log_metrics(resumed.step(step), step=step)
    report = {**stub.restore_reports[-1], "checkpoint_id": None}
    restore_report_record(actor=creator, run=continued, body=report)
    _ingest(log, continued, stub.points)
    continued.refresh_from_db()
    return selectors.declared_verdict_of(continued, selectors.parity_of(continued))


def test_an_lr_the_restored_scheduler_put_back_is_named_as_overridden(continue_with_new_lr):
    declared = continue_with_new_lr(scheduler=True, set_after_load=False)
    (lr,) = declared.changes
    assert (lr.key, lr.old_value, lr.new_value) == ("lr", OLD, NEW)
    assert (lr.took_effect_at_step, lr.overridden, lr.overridden_by, lr.evidence) == (
        None,
        True,
        "scheduler",
        "train.lr",
    )
    assert not declared.divergence_declared


def test_an_lr_set_after_the_load_takes_effect_at_the_first_step_after_the_checkpoint(continue_with_new_lr):
    declared = continue_with_new_lr(scheduler=False, set_after_load=True)
    (lr,) = declared.changes
    assert (lr.took_effect_at_step, lr.overridden, lr.evidence) == (SAVED_AT, False, "train.lr")
    assert declared.divergence_declared
