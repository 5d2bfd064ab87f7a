"""The stock MLflow 3 client (mlflow-skinny) against a live mado server (SPEC F30, issue 7 "Done when")."""

import hashlib
import math

import pytest

mlflow = pytest.importorskip("mlflow")

from runs.models import MetricPoint, Run  # noqa: E402
from tests.deployment import deployment  # noqa: E402

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
        assert {m["path"]: m["sha256"] for m in manifest} == {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}
