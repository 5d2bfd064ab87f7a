"""The stock MLflow integrations of Hugging Face and Lightning, unchanged, against a live mado server: each saved
checkpoint becomes a complete mado Checkpoint at its global step, and a Job started from it on the page gets the
directory the framework resumes from (docs/design/checkpoints.md#mlflow-checkpoints; docs/design/resume.md#continue).

Tiny models built from configs, generated data, nothing downloaded.
"""

import hashlib
import os
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.callbacks import Callback, ModelCheckpoint  # noqa: E402
from lightning.pytorch.loggers import MLFlowLogger  # noqa: E402

from checkpoints.models import Artifact, Checkpoint, CheckpointState  # noqa: E402
from jobs.models import Job, Queue  # noqa: E402
from jobs.services import job_claim, job_finish, job_launch  # noqa: E402
from jobs.services.lifecycle import run_token_issue  # noqa: E402
from runs.models import LoggedModel, Run  # noqa: E402
from runs.resume import run_start  # noqa: E402
from tests.factories import CodeVersionFactory  # noqa: E402
from worker.execute import prepare  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(directory: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file below ``directory``."""
    return {p.relative_to(directory).as_posix(): _sha(p) for p in directory.rglob("*") if p.is_file()}


def _checkpoints(client, run: Run) -> list[dict]:
    """The Run's checkpoints as the API lists them, with each one's manifest."""
    listed = client.get(f"/api/v1/runs/{run.pk}/checkpoints/").json()["results"]
    return [client.get(f"/api/v1/checkpoints/{c['id']}/").json() for c in listed]


def _prepared(job_id: int, tmp_path: Path):
    """What the worker does before it starts the Job's code: fetch, verify and extract the source checkpoint."""
    workdir = tmp_path / f"job-{job_id}"
    workdir.mkdir()
    return prepare(
        Job.objects.select_related("run__source_checkpoint", "code_version").get(pk=job_id), workdir, lambda: None
    )


# --- Hugging Face: report_to="mlflow", HF_MLFLOW_LOG_ARTIFACTS=1 ------------------------------------------------------


class _StepCounter(transformers.TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def _hf_train(output_dir: Path, *, report_to: str, resume_from: str | None = None) -> _StepCounter:
    """10 steps of a 1-layer GPT-2 (16 wide) on random tokens, saving every 5 steps."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config)
    data = [{"input_ids": torch.randint(0, 64, (8,)), "labels": torch.randint(0, 64, (8,))} for _ in range(20)]
    args = transformers.TrainingArguments(
        output_dir=str(output_dir),
        max_steps=10,
        save_steps=5,
        logging_steps=5,
        per_device_train_batch_size=2,
        report_to=[report_to],
        use_cpu=True,
        disable_tqdm=True,
    )
    counter = _StepCounter()
    transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[counter]).train(
        resume_from_checkpoint=resume_from
    )
    return counter


def test_hf_trainer_checkpoints_become_checkpoints_and_a_continued_job_resumes_from_one(
    mlflow_env, monkeypatch, tmp_path, api, login, project, member
):
    monkeypatch.setenv("HF_MLFLOW_LOG_ARTIFACTS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", str(project.pk))
    _hf_train(tmp_path / "out", report_to="mlflow")

    run = Run.objects.get(project=project)
    client = api(member)
    checkpoints = _checkpoints(client, run)
    assert [(c["step"], c["state"], c["framework"]) for c in checkpoints] == [
        (10, "complete", "transformers"),
        (5, "complete", "transformers"),
    ]
    for checkpoint in checkpoints:  # exactly HF's checkpoint-N directory
        local = _files(tmp_path / "out" / f"checkpoint-{checkpoint['step']}")
        assert {m["path"]: m["sha256"] for m in checkpoint["manifest"]} == local
        assert "trainer_state.json" in local and checkpoint["includes_optimizer"]
    model = LoggedModel.objects.get(run=run, name="checkpoint-5")  # still an MLflow model with its own files
    assert {"MLmodel", "python_model.pkl"} <= set(
        Artifact.objects.filter(logged_model=model).values_list("path", flat=True)
    )

    # "Continue training from these weights" on the Run's checkpoint tab, then what the worker hands the code
    tab = login(member).get(f"/runs/{run.pk}/checkpoints/").content.decode()
    assert f'href="/checkpoints/{checkpoints[1]["id"]}/continue/"' in tab
    code_version = CodeVersionFactory(code__project=project, code__created_by=member)
    Queue.objects.get_or_create(name="cpu")
    answer = client.post(
        f"/api/v1/checkpoints/{checkpoints[1]['id']}/continue/",
        {"code_version_id": code_version.pk, "queue": "cpu", "input_dataset_version_ids": []},
        format="json",
    )
    assert answer.status_code == 201, answer.content
    prepared = _prepared(answer.json()["id"], tmp_path)
    assert prepared.step == 5 and _files(prepared.checkpoint_dir) == _files(tmp_path / "out" / "checkpoint-5")

    resumed = _hf_train(tmp_path / "again", report_to="none", resume_from=str(prepared.checkpoint_dir))
    assert resumed.steps == [6, 7, 8, 9, 10]  # HF picked up at step 5 from the extracted directory


# --- Lightning: MLFlowLogger(log_model="all") with ModelCheckpoint(every_n_train_steps=5, save_top_k=-1) -----------


class _Tiny(pl.LightningModule):
    def __init__(self, fail_at: int | None = None):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.fail_at = fail_at

    def training_step(self, batch, batch_idx):
        if self.global_step == self.fail_at:
            raise RuntimeError(f"simulated crash at step {self.fail_at}")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _FirstStep(Callback):
    def __init__(self):
        self.first = None

    def on_train_batch_start(self, trainer, *args):
        self.first = trainer.global_step if self.first is None else self.first


def _fit(model, *, max_steps=10, logger=None, callbacks=(), ckpt_path=None) -> None:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(80, 4), torch.randn(80, 1))
    trainer = pl.Trainer(
        max_steps=max_steps,
        logger=logger or False,
        callbacks=list(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
    )
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4), ckpt_path=ckpt_path)


def _job_run(creator, project):
    """A running Job's Run and the Job's Run token: the code logs with ``MLFLOW_TRACKING_TOKEN=$MMT_API_TOKEN``."""
    code_version = CodeVersionFactory(code__project=project, code__created_by=creator)
    queue = Queue.objects.get_or_create(name="cpu")[0]
    job = job_launch(actor=creator, code_version=code_version, queue=queue, parameters={}, dataset_version_ids=[])
    job_claim(job_id=job.pk, worker_host="gpu-1")
    run = run_start(actor=creator, project=project, external_id=job.run.external_id, resume="allow").run
    return job, run, run_token_issue(job=job).key


def test_lightning_checkpoints_become_checkpoints_and_the_crashed_job_resumes_from_one(
    mlflow_env, monkeypatch, tmp_path, api, login, project, creator
):
    job, run, token = _job_run(creator, project)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", token)
    logger = MLFlowLogger(tracking_uri=mlflow_env, run_id=run.external_id, log_model="all")
    saver = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=5, save_top_k=-1)
    with pytest.raises(RuntimeError, match="simulated crash at step 12"):
        _fit(_Tiny(fail_at=12), max_steps=15, logger=logger, callbacks=[saver])
    job_finish(job_id=job.pk, exit_code=1)

    client = api(creator)
    checkpoints = _checkpoints(client, run)
    assert [(c["step"], c["state"], c["framework"]) for c in checkpoints] == [
        (10, "complete", "lightning"),
        (5, "complete", "lightning"),
    ]
    for checkpoint in checkpoints:
        name = f"epoch=0-step={checkpoint['step']}.ckpt"
        assert [(m["path"], m["sha256"]) for m in checkpoint["manifest"]] == [(name, _sha(tmp_path / "ckpt" / name))]
    plain = set(Artifact.objects.filter(run=run).values_list("path", flat=True))
    assert {"epoch=0-step=5/metadata.yaml", "epoch=0-step=5/aliases.txt"} <= plain  # the logger's own files

    # "Resume" on the crashed Job's checkpoint tab, then what the worker hands the code
    page = login(creator)
    resume = f"/checkpoints/{checkpoints[1]['id']}/resume/"
    assert f'href="{resume}"' in page.get(f"/runs/{run.pk}/checkpoints/").content.decode()
    assert page.post(resume).status_code == 302
    prepared = _prepared(Job.objects.exclude(pk=job.pk).get().pk, tmp_path)
    assert prepared.step == 5 and os.listdir(prepared.checkpoint_dir) == ["epoch=0-step=5.ckpt"]
    first = _FirstStep()
    _fit(_Tiny(), callbacks=[first], ckpt_path=str(prepared.checkpoint_dir / "epoch=0-step=5.ckpt"))
    assert first.first == 5  # Lightning restored its loop at the checkpoint's global step
    assert Checkpoint.objects.filter(run=run, state=CheckpointState.COMPLETE).count() == 2
