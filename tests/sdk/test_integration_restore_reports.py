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

import mado_tracking
from mado_tracking import restore_check
from mado_tracking.integrations import accelerate as mado_accelerate
from tests.sdk.programs import set_job_resume_variables
from tests.sdk.stub_api import StubApi
from tests.sdk.test_accelerate_integration import _fresh_accelerate_state, _prepared, _train  # noqa: F401 - autouse

pytestmark = pytest.mark.usefixtures("fresh_restore_check")

os.environ.setdefault("HF_HUB_OFFLINE", "1")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"restore_report_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


# -- Lightning --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lightning_checkpoint(tmp_path_factory) -> dict[bool, Path]:
    """For each data loader (True: ResumableDataLoader, False: a plain shuffled DataLoader), a mado checkpoint
    directory holding the step-20 ``.ckpt`` (mid-epoch) of a 20-step fit with ``MadoResume``."""
    from tests.sdk.lightning_fits import fit, restore_torch_globals

    restore = restore_torch_globals()
    root = tmp_path_factory.mktemp("lightning")
    found = {}
    for exact in (True, False):
        fit(root / f"fit-{exact}", steps=20, exact_data=exact)
        directory = found[exact] = root / f"ckpt-{exact}"
        directory.mkdir()
        (directory / "epoch=1-step=20.ckpt").write_bytes((root / f"fit-{exact}" / "epoch=1-step=20.ckpt").read_bytes())
    restore()
    return found


def _lightning_resume(tmp_path, monkeypatch, checkpoints: dict, *, mado_resume: bool, exact_data: bool = True):
    from mado_tracking.integrations.lightning import MadoLogger, resume_ckpt_path
    from tests.sdk.lightning_fits import fit, restore_torch_globals

    checkpoint = checkpoints[exact_data]
    set_job_resume_variables(monkeypatch, checkpoint, 20, tmp_path / "resume-checkpoint.json")
    restore = restore_torch_globals()
    with StubApi() as stub:
        for name, value in (("MMT_API_URL", stub.url), ("MMT_API_TOKEN", "stub-token"), ("MMT_PROJECT", "vision")):
            monkeypatch.setenv(name, value)
        logger = MadoLogger()
        path = resume_ckpt_path(logger)
        fit(tmp_path / "fit", logger=logger, ckpt_path=path, steps=25, mado_resume=mado_resume, exact_data=exact_data)
    restore()
    return stub


def test_lightning_with_mado_resume_reports_every_part_of_the_ckpt_restored(
    tmp_path, monkeypatch, lightning_checkpoint, caplog
):
    with caplog.at_level(logging.WARNING, logger="mado_tracking"):
        stub = _lightning_resume(tmp_path, monkeypatch, lightning_checkpoint, mado_resume=True)
    [report] = stub.restore_reports
    assert set(report["parts"]) == {
        "model",
        "optimizer",
        "rng.python",
        "rng.numpy",
        "rng.torch",
        "data_position",
        "global_step",
    }
    assert _not_restored(report) == {} and report["details"] == {}
    assert stub.events.index("restore-report") < stub.events.index("metrics")
    assert not [r for r in caplog.records if r.name == "mado_tracking" and r.levelno >= logging.WARNING]


def test_lightning_a_plain_loader_resumed_mid_epoch_is_reported_not_restored(
    tmp_path, monkeypatch, lightning_checkpoint
):
    stub = _lightning_resume(tmp_path, monkeypatch, lightning_checkpoint, mado_resume=True, exact_data=False)
    [report] = stub.restore_reports
    assert _not_restored(report) == {"data_position": "not_restored"}
    assert "DataLoader has no state_dict" in report["details"]["data_position"]


def test_lightning_resumed_through_the_logger_alone_reports_rng_and_data_position_not_restored_and_says_how_to_fix(
    tmp_path, monkeypatch, lightning_checkpoint, caplog
):
    with caplog.at_level(logging.WARNING, logger="mado_tracking"):
        stub = _lightning_resume(tmp_path, monkeypatch, lightning_checkpoint, mado_resume=False)
    [report] = stub.restore_reports
    assert _not_restored(report) == dict.fromkeys(
        ("rng.python", "rng.numpy", "rng.torch", "data_position"), "not_restored"
    )
    assert {"model", "optimizer", "global_step"} <= set(report["parts"])
    assert stub.events.index("restore-report") < stub.events.index("metrics")
    [fix] = [r.getMessage() for r in caplog.records if "without MadoResume" in r.getMessage()]
    assert "Add MadoResume() to Trainer(callbacks=[...])" in fix


def test_lightning_checkpoints_list_what_the_ckpt_holds_the_scheduler_too(tmp_path):
    import lightning.pytorch as pl

    from mado_tracking.integrations.lightning_logger import read_parts
    from tests.sdk.lightning_fits import example, restore_torch_globals

    class Scheduled(example.Classifier):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 5)}

    restore = restore_torch_globals()
    trainer = pl.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(Scheduled(32, 0.2, 0.1), torch.utils.data.DataLoader(example.dataset(), batch_size=16))
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    restore()
    assert read_parts(tmp_path / "last.ckpt") == ["model", "optimizer", "scheduler"]
    assert read_parts(tmp_path / "missing.ckpt") is None


# -- Accelerate -------------------------------------------------------------------------------------------------------


def _accelerate_resume(tmp_path, monkeypatch, *, seedable: bool = True, batches: bool = True, scheduler: bool = True):
    """Train 9 steps (``batches`` or a plain loop), save at 9, resume a Job from there against the stub."""
    accelerator, model, optimizer, loader, schedule = _prepared(seedable=seedable)
    with mado_tracking.start_run(offline=True, output=tmp_path / "first") as run:
        if batches:
            _train(accelerator, model, optimizer, loader, schedule, 9)
        mado_accelerate.save_state(accelerator, run, 9, tmp_path / "ckpt", wait=True)
    set_job_resume_variables(monkeypatch, tmp_path / "ckpt" / "step-9", 9, tmp_path / "resume-checkpoint.json")
    accelerator, model, optimizer, loader, schedule = _prepared(seedable=seedable)
    if not scheduler:
        accelerator._schedulers.clear()
    with StubApi() as stub, mado_tracking.start_run(**_online(stub)) as run:
        assert mado_accelerate.load_state(accelerator, run) == 9
        _train(
            accelerator, model, optimizer, loader, schedule, 2, after=lambda n: run.log_metrics({"x": n}, step=9 + n)
        )
    return stub


def test_accelerate_the_documented_resume_reports_every_part_load_state_restored(tmp_path, monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger="mado_tracking"):
        stub = _accelerate_resume(tmp_path, monkeypatch)
    [report] = stub.restore_reports
    assert set(report["parts"]) == {
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
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    ("changes", "expected", "said"),
    [
        ({"scheduler": False}, {"scheduler": "not_restored"}, "accelerator.prepare was given 0 scheduler(s)"),
        ({"seedable": False}, {"data_position": "not_restored"}, "use_seedable_sampler=True"),
        ({"batches": False}, {"data_position": "not_declared"}, "batches(accelerator, loader)"),
    ],
)
def test_accelerate_a_part_not_loaded_or_not_recorded_is_named(tmp_path, monkeypatch, changes, expected, said):
    [report] = _accelerate_resume(tmp_path, monkeypatch, **changes).restore_reports
    assert _not_restored(report) == expected
    assert said in report["details"][next(iter(expected))]
