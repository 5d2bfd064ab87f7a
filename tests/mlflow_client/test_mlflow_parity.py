"""MLflow scripts that work on an MLflow server work unchanged on mado (docs/design/interfaces.md#mlflow).

Each test runs what a user's script does with the stock client (mlflow-skinny)
and asserts the answer an MLflow 3 tracking server gives for it.
"""

import pytest

mlflow = pytest.importorskip("mlflow")

from mlflow.entities import ViewType  # noqa: E402

from runs.models import Project, Run  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_without_an_experiment_goes_to_the_default_experiment_0(mlflow_env, member):
    with mlflow.start_run() as active:
        mlflow.log_metric("loss", 0.5, step=1)
    # MLflow's server: experiment "0" is named "Default" and exists before anyone creates it.
    default = mlflow.tracking.MlflowClient().get_experiment("0")
    assert default.name == "Default"
    run = Run.objects.get(external_id=active.info.run_id)
    assert run.project.name == "Default" and run.project.memberships.get(user=member).role == "admin"
    assert run.project == Project.objects.get(default_for=member)
    with mlflow.start_run() as second:  # the same Default Project again, not a second one
        pass
    assert Run.objects.get(external_id=second.info.run_id).project == run.project


def test_each_user_has_their_own_default_experiment(mlflow_env, member, admin, monkeypatch):
    with mlflow.start_run():
        pass
    from tests.factories import api_key

    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", api_key(admin))
    with mlflow.start_run():
        pass
    assert Project.objects.filter(name="Default").count() == 2
    assert Project.objects.get(default_for=admin).memberships.get().user == admin


@pytest.mark.parametrize("end_status", ["FINISHED", "FAILED"])
def test_start_run_with_an_ended_run_id_reopens_it(mlflow_env, end_status):
    mlflow.set_experiment("Reopen")
    first = mlflow.start_run()
    mlflow.log_metric("loss", 1.0, step=0)
    mlflow.end_run(end_status)
    client = mlflow.tracking.MlflowClient()
    assert client.get_run(first.info.run_id).info.status == end_status
    # MLflow's server: RUNNING inside the block (end_time kept from before), FINISHED after it.
    with mlflow.start_run(run_id=first.info.run_id):
        assert client.get_run(first.info.run_id).info.status == "RUNNING"
        mlflow.log_metric("loss", 0.5, step=1)
    info = client.get_run(first.info.run_id).info
    assert info.status == "FINISHED" and info.end_time is not None
    assert [m.value for m in client.get_metric_history(first.info.run_id, "loss")] == [1.0, 0.5]


def test_mlflow_run_id_variable_reopens_a_finished_run(mlflow_env, monkeypatch):
    mlflow.set_experiment("Scheduler")
    with mlflow.start_run() as first:
        pass
    monkeypatch.setenv("MLFLOW_RUN_ID", first.info.run_id)
    with mlflow.start_run() as again:
        mlflow.log_param("attempt", "2")
    assert again.info.run_id == first.info.run_id
    assert Run.objects.get(external_id=first.info.run_id).parameters == {"attempt": "2"}


def test_a_viewer_cannot_reopen_a_run(mlflow_env, viewer, monkeypatch, project, member):
    from tests.factories import api_key

    with mlflow.start_run(experiment_id=str(project.pk)) as first:
        pass
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", api_key(viewer))
    with pytest.raises(mlflow.exceptions.MlflowException) as refused:
        mlflow.start_run(run_id=first.info.run_id)
    assert refused.value.error_code == "PERMISSION_DENIED"
    assert Run.objects.get(external_id=first.info.run_id).status == "finished"


def test_experiment_tags_are_set_read_and_deleted(mlflow_env):
    experiment_id = mlflow.set_experiment("Tagged").experiment_id
    mlflow.set_experiment_tag("team", "vision")
    mlflow.set_experiment_tags({"stage": "dev", "team": "speech"})
    client = mlflow.tracking.MlflowClient()
    tags = client.get_experiment(experiment_id).tags
    assert tags["team"] == "speech" and tags["stage"] == "dev"
    client.delete_experiment_tag(experiment_id, "stage")
    assert "stage" not in client.get_experiment(experiment_id).tags
    with pytest.raises(mlflow.exceptions.MlflowException) as missing:
        client.delete_experiment_tag(experiment_id, "stage")
    assert missing.value.error_code == "RESOURCE_DOES_NOT_EXIST"


def test_delete_run_hides_it_from_searches_and_restore_brings_it_back(mlflow_env):
    experiment_id = mlflow.set_experiment("Deletes").experiment_id
    with mlflow.start_run() as kept:
        pass
    with mlflow.start_run() as dropped:
        mlflow.log_metric("loss", 1.0)
    client = mlflow.tracking.MlflowClient()
    client.delete_run(dropped.info.run_id)
    # MLflow's server: the run still answers get_run, marked deleted; searches leave it out by default.
    assert client.get_run(dropped.info.run_id).info.lifecycle_stage == "deleted"
    assert [r.info.run_id for r in client.search_runs([experiment_id])] == [kept.info.run_id]
    deleted = client.search_runs([experiment_id], run_view_type=ViewType.DELETED_ONLY)
    assert [r.info.run_id for r in deleted] == [dropped.info.run_id]
    assert len(client.search_runs([experiment_id], run_view_type=ViewType.ALL)) == 2
    with pytest.raises(mlflow.exceptions.MlflowException, match="deleted"):
        mlflow.start_run(run_id=dropped.info.run_id)
    client.restore_run(dropped.info.run_id)
    assert client.get_run(dropped.info.run_id).info.lifecycle_stage == "active"
    assert len(client.search_runs([experiment_id])) == 2
    assert client.get_metric_history(dropped.info.run_id, "loss")[0].value == 1.0


def test_log_text_twice_overwrites_and_keeps_the_old_digest(mlflow_env):
    import hashlib

    from checkpoints.models import Artifact

    mlflow.set_experiment("Overwrite")
    with mlflow.start_run() as active:
        mlflow.log_text("v1", "out.txt")
        mlflow.log_text("v2", "out.txt")
    # MLflow's server: the second upload replaces the file.
    assert mlflow.artifacts.load_text(f"runs:/{active.info.run_id}/out.txt") == "v2"
    stored = Artifact.objects.get(run__external_id=active.info.run_id, path="out.txt")
    assert stored.sha256 == hashlib.sha256(b"v2").hexdigest()
    assert [(h["sha256"], h["size"]) for h in stored.history] == [(hashlib.sha256(b"v1").hexdigest(), 2)]


def _dataset(digest: str):
    from mlflow.data.http_dataset_source import HTTPDatasetSource
    from mlflow.data.meta_dataset import MetaDataset

    return MetaDataset(
        source=HTTPDatasetSource(f"https://data.example/digits-{digest}.csv"), name="digits", digest=digest
    )


def test_log_input_maps_datasets_onto_dataset_versions_and_data_stages(mlflow_env, api, member):
    from runs.selectors import data_composition_at

    mlflow.set_experiment("Datasets")
    with mlflow.start_run() as active:
        mlflow.log_input(_dataset("v3"), context="training")
        for step in range(5):
            mlflow.log_metric("loss", 1.0, step=step)
        mlflow.log_input(_dataset("v4"), context="training")
        mlflow.log_input(_dataset("v4"), context="training")  # again: nothing new
    run = Run.objects.get(external_id=active.info.run_id)
    assert [v.version for v in run.input_dataset_versions.all()] == ["v3"]
    stage = run.data_stages.get()
    assert stage.start_step == 5 and sorted(v.version for v in stage.dataset_versions.all()) == ["v3", "v4"]
    assert [v.version for v in data_composition_at(run=run, step=4)] == ["v3"]
    # MLflow's server: get_run lists the run's dataset inputs with their name, digest, source and context.
    inputs = mlflow.tracking.MlflowClient().get_run(active.info.run_id).inputs.dataset_inputs
    assert sorted((i.dataset.name, i.dataset.digest, i.dataset.source_type) for i in inputs) == [
        ("digits", "v3", "http"),
        ("digits", "v4", "http"),
    ]
    assert {t.key: t.value for t in inputs[0].tags} == {"mlflow.data.context": "training"}
    history = api(member).get(f"/api/v1/runs/{run.pk}/data-stages/").json()["results"]
    assert [[v["version"] for v in entry["added"]] for entry in history] == [["v4"]]
