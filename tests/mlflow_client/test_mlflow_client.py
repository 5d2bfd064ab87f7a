"""The stock MLflow 3 client (mlflow-skinny) against a live mado server (docs/design/interfaces.md#mlflow)."""

import hashlib
import math

import pytest

mlflow = pytest.importorskip("mlflow")

from runs.models import MetricPoint, Run  # noqa: E402
from tests.deployment import deployment  # noqa: E402
from tests.factories import api_key  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


def _train(experiment: str) -> str:
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name="mlflow-script", tags={"mado.kind": "fine_tuning"}) as active:
        mlflow.log_param("lr", 0.01)
        mlflow.log_params({"batch_size": 32, "optimizer": "adam"})
        for step in range(3):
            mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
            mlflow.log_metrics({"acc": 0.5 + step / 10, "lr_now": 0.01}, step=step)
        mlflow.log_metric("loss", float("nan"), step=3)
        mlflow.set_tag("team", "vision")
        return active.info.run_id


def test_a_training_script_logs_through_the_stock_client(mlflow_env, member):
    run_id = _train("Speech")

    run = Run.objects.get(external_id=run_id)
    assert run.project.name == "Speech" and run.project.memberships.get(user=member).role == "admin"
    assert run.status == "finished" and run.kind == "fine_tuning" and run.name == "mlflow-script"
    assert run.parameters == {"lr": "0.01", "batch_size": "32", "optimizer": "adam"}
    assert run.tags.get(key="team").value == "vision"
    assert MetricPoint.objects.filter(run=run, key="loss").count() == 4

    client = mlflow.tracking.MlflowClient()
    history = client.get_metric_history(run_id, "loss")
    assert [m.step for m in history] == [0, 1, 2, 3]
    assert [m.value for m in history[:3]] == [1.0, 0.5, 1.0 / 3] and math.isnan(history[3].value)
    assert all(m.timestamp > 1_600_000_000_000 for m in history)

    experiment = client.get_experiment_by_name("Speech")
    found = client.search_runs([experiment.experiment_id], filter_string="params.optimizer = 'adam'")
    assert [r.info.run_id for r in found] == [run_id]
    assert found[0].info.status == "FINISHED" and found[0].data.tags["team"] == "vision"
    assert found[0].data.metrics["acc"] == pytest.approx(0.7)
    assert client.search_runs([experiment.experiment_id], filter_string="tags.team = 'other'") == []
    assert len(client.search_runs([experiment.experiment_id], filter_string="attributes.status = 'FINISHED'")) == 1


def test_relogging_a_param_with_another_value_fails_in_the_client(mlflow_env):
    mlflow.set_experiment("Params")
    with mlflow.start_run():
        mlflow.log_param("lr", "0.1")
        mlflow.log_param("lr", "0.1")
        with pytest.raises(mlflow.exceptions.MlflowException, match="Changing param values is not allowed"):
            mlflow.log_param("lr", "0.2")


def test_basic_credentials_work_like_the_token(monkeypatch, mlflow_env, member):
    member.set_password("s3cret-pass")
    member.save()
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", member.username)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret-pass")
    run_id = _train("Basic auth")
    assert Run.objects.get(external_id=run_id).created_by == member


def test_artifacts_round_trip_byte_exact_and_become_a_checkpoint(monkeypatch, tmp_path):
    """Against gunicorn (the client sends an empty file as a chunked body, which Django's test server cannot read)."""
    source = tmp_path / "ckpt"
    (source / "nested" / "deeper").mkdir(parents=True)
    (source / "weights.bin").write_bytes(bytes(range(256)) * 100)
    (source / "nested" / "deeper" / "opt state.pt").write_bytes(b"optimizer")
    (source / "empty.txt").write_bytes(b"")
    files = {path.relative_to(source).as_posix(): path.read_bytes() for path in source.rglob("*") if path.is_file()}
    with deployment(tmp_path / "site") as site:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", site.url)
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", site.token)
        mlflow.set_tracking_uri(site.url)
        mlflow.set_experiment("Artifacts")
        with mlflow.start_run() as active:
            mlflow.log_artifacts(str(source), "checkpoints/step-100")
        mlflow.artifacts.download_artifacts(
            run_id=active.info.run_id, artifact_path="checkpoints/step-100", dst_path=str(tmp_path / "back")
        )
        for relative, data in files.items():
            assert (tmp_path / "back" / "step-100" / relative).read_bytes() == data, relative
        client = site.client()
        run = client.request("GET", "runs/", params={"external_id": active.info.run_id})["results"][0]
        checkpoints = client.request("GET", f"runs/{run['id']}/checkpoints/")["results"]
        assert [(c["step"], c["state"], c["file_count"]) for c in checkpoints] == [(100, "complete", len(files))]
        manifest = client.request("GET", f"checkpoints/{checkpoints[0]['id']}/")["manifest"]
        assert {m["path"]: m["sha256"] for m in manifest} == {
            p: hashlib.sha256(d).hexdigest() for p, d in files.items()
        }


# --- One authentication on both MLflow APIs (docs/design/runs.md#write-rule): Run token, Basic with API token ---------


def _log_everything(tmp_path, run) -> None:
    """What a training script does in an existing Run: params, metrics and a file artifact through the client."""
    (tmp_path / "notes.txt").write_text("epoch 1 done\n")
    mlflow.set_experiment(experiment_id=str(run.project_id))
    with mlflow.start_run(run_id=run.external_id):
        mlflow.log_param("seed", 7)
        mlflow.log_metric("loss", 0.25, step=1)
        mlflow.log_artifact(str(tmp_path / "notes.txt"), "reports")


def _job_run(creator, project):
    """A running Job's Run (its SDK attached) and the Job's Run token."""
    from jobs.models import Queue
    from jobs.services import job_claim, job_launch
    from jobs.services.lifecycle import run_token_issue
    from runs.resume import run_start
    from tests.factories import CodeVersionFactory

    code_version = CodeVersionFactory(code__project=project, code__created_by=creator, version=1)
    queue = Queue.objects.get_or_create(name="cpu")[0]
    job = job_launch(
        actor=creator, code_version=code_version, queue=queue, parameters={}, dataset_version_ids=[], name="job-run"
    )
    job_claim(job_id=job.pk, worker_host="gpu-1")
    run = run_start(actor=creator, project=project, external_id=job.run.external_id, resume="allow").run
    return run, run_token_issue(job=job).key


def _stored(run) -> tuple:
    from checkpoints.models import Artifact

    run.refresh_from_db()
    return (
        run.parameters.get("seed"),
        list(MetricPoint.objects.filter(run=run).values_list("key", "step")),
        Artifact.objects.get(run=run, path="reports/notes.txt").size,
    )


def test_a_jobs_run_token_logs_through_the_stock_client_on_its_own_run_only(
    mlflow_env, monkeypatch, tmp_path, creator, project
):
    run, token = _job_run(creator, project)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", token)
    _log_everything(tmp_path, run)
    assert _stored(run) == ("7", [("loss", 1)], len("epoch 1 done\n"))
    other = Run.objects.create(project=project, created_by=creator, name="other", external_id="other-run")
    with pytest.raises(mlflow.exceptions.MlflowException, match="may only act on that run"):
        mlflow.tracking.MlflowClient().log_param(other.external_id, "seed", 1)
    with pytest.raises(mlflow.exceptions.MlflowException, match="may only act on that run"):
        mlflow.set_experiment("Elsewhere")


def test_basic_with_an_api_token_as_password_logs_to_tracking_and_artifacts(
    mlflow_env, monkeypatch, tmp_path, creator, project
):
    run = Run.objects.create(
        project=project, created_by=creator, name="basic", external_id="basic-run", status="running"
    )
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", creator.username)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", api_key(creator))
    _log_everything(tmp_path, run)
    assert _stored(run) == ("7", [("loss", 1)], len("epoch 1 done\n"))


def test_an_outsider_cannot_take_a_projects_name_and_is_told_so(mlflow_env, monkeypatch, outsider, project):
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", api_key(outsider))
    with pytest.raises(mlflow.exceptions.MlflowException, match="cannot be used: choose another name") as raised:
        mlflow.set_experiment(project.name)
    assert project.slug not in str(raised.value) and project.name not in str(raised.value)
