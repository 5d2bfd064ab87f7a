"""MLflow 3 logged models through the stock client against mado (docs/design/interfaces.md#mlflow).

``mlflow.pytorch.log_model`` / ``load_model`` round-trip by ``models:/<model_id>``
and ``runs:/<run_id>/<name>``, and the client's logged-model calls answer as
an MLflow 3 tracking server does.
"""

import pytest

mlflow = pytest.importorskip("mlflow")
torch = pytest.importorskip("torch")
pytest.importorskip("pandas")  # mlflow.pytorch imports it

import mlflow.pytorch  # noqa: E402
from mlflow.entities import LoggedModelStatus  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402

from checkpoints.models import Artifact  # noqa: E402
from runs.models import LoggedModel, Run  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))


def test_pytorch_log_model_and_load_model_round_trip(mlflow_env, tmp_path):
    net, sample = _net(), torch.randn(5, 4)
    mlflow.set_experiment("Models")
    with mlflow.start_run() as active:
        mlflow.log_metric("loss", 0.25, step=7)
        info = mlflow.pytorch.log_model(net, name="net", step=7, input_example=sample.numpy())
    run_id = active.info.run_id

    # What MLflow's server answers: a READY model of the run's experiment, linked to the run, with its metrics at the
    # step.
    client = mlflow.tracking.MlflowClient()
    model = client.get_logged_model(info.model_id)
    assert model.status == LoggedModelStatus.READY and model.name == "net"
    assert model.source_run_id == run_id and model.experiment_id == active.info.experiment_id
    assert model.artifact_location == f"mlflow-artifacts:/{active.info.experiment_id}/models/{info.model_id}/artifacts"
    assert [(m.key, m.value, m.step) for m in model.metrics] == [("loss", 0.25, 7)]
    stored = LoggedModel.objects.get(model_id=info.model_id)
    assert stored.run == Run.objects.get(external_id=run_id) and stored.step == 7
    names = set(Artifact.objects.filter(logged_model=stored).values_list("path", flat=True))
    assert "MLmodel" in names and any(name.startswith("data/") for name in names)
    assert not Artifact.objects.filter(
        run=stored.run, path__startswith="net/"
    ).exists()  # not mixed into the run's files

    for uri in (f"models:/{info.model_id}", f"runs:/{run_id}/net"):
        target = tmp_path / uri.replace(":", "").replace("/", "_")
        target.mkdir()
        loaded = mlflow.pytorch.load_model(uri, dst_path=str(target))
        assert torch.equal(loaded(sample), net(sample)), uri


def test_a_model_logged_outside_a_run_has_no_source_run(mlflow_env):
    mlflow.set_experiment("Loose")
    info = mlflow.pytorch.log_model(_net(), name="loose", input_example=torch.randn(2, 4).numpy())
    model = mlflow.tracking.MlflowClient().get_logged_model(info.model_id)
    assert model.source_run_id == "" and model.status == LoggedModelStatus.READY  # as from MLflow: field left out
    assert LoggedModel.objects.get(model_id=info.model_id).run is None


def test_search_tags_finalize_and_delete_answer_as_mlflow_does(mlflow_env):
    client = mlflow.tracking.MlflowClient()
    experiment_id = mlflow.set_experiment("Search").experiment_id
    with mlflow.start_run() as active:
        first = mlflow.initialize_logged_model(name="alpha", tags={"team": "vision"}, model_type="agent")
        second = mlflow.initialize_logged_model(name="beta", params={"lr": "0.1"})
    assert first.status == LoggedModelStatus.PENDING and first.source_run_id == active.info.run_id

    found = client.search_logged_models(experiment_ids=[experiment_id], filter_string="name = 'alpha'")
    assert [m.model_id for m in found] == [first.model_id]
    found = client.search_logged_models(experiment_ids=[experiment_id], filter_string="tags.team = 'vision'")
    assert [m.model_id for m in found] == [first.model_id]
    newest_first = client.search_logged_models(experiment_ids=[experiment_id])
    assert [m.model_id for m in newest_first] == [second.model_id, first.model_id]
    page = client.search_logged_models(experiment_ids=[experiment_id], max_results=1)
    assert len(page) == 1 and page.token
    assert [
        m.model_id
        for m in client.search_logged_models(experiment_ids=[experiment_id], max_results=1, page_token=page.token)
    ] == [first.model_id]

    client.set_logged_model_tags(first.model_id, {"stage": "prod"})
    tags = client.get_logged_model(first.model_id).tags
    assert {k: v for k, v in tags.items() if not k.startswith("mlflow.")} == {"team": "vision", "stage": "prod"}
    client.delete_logged_model_tag(first.model_id, "stage")
    with pytest.raises(MlflowException) as missing_tag:  # MLflow: RESOURCE_DOES_NOT_EXIST
        client.delete_logged_model_tag(first.model_id, "stage")
    assert missing_tag.value.error_code == "RESOURCE_DOES_NOT_EXIST"

    assert client.finalize_logged_model(second.model_id, LoggedModelStatus.FAILED).status == LoggedModelStatus.FAILED
    client.delete_logged_model(second.model_id)
    with pytest.raises(MlflowException) as gone:
        client.get_logged_model(second.model_id)
    assert gone.value.error_code == "RESOURCE_DOES_NOT_EXIST" and second.model_id in str(gone.value)
    assert [m.model_id for m in client.search_logged_models(experiment_ids=[experiment_id])] == [first.model_id]


def test_bad_names_and_filters_are_refused_like_mlflow(mlflow_env):
    client = mlflow.tracking.MlflowClient()
    experiment_id = mlflow.set_experiment("Bad").experiment_id
    for name in ("a/b", "../x", "m:1", "50%"):
        with pytest.raises(MlflowException) as refused:
            client.create_logged_model(experiment_id=experiment_id, name=name)
        assert refused.value.error_code == "INVALID_PARAMETER_VALUE", name
    with pytest.raises(MlflowException) as bad_filter:
        client.search_logged_models(experiment_ids=[experiment_id], filter_string="name = 'a' OR 1=1")
    assert bad_filter.value.error_code == "INVALID_PARAMETER_VALUE"
    with pytest.raises(MlflowException) as unknown:
        client.get_logged_model("m-" + "0" * 32)
    assert unknown.value.error_code == "RESOURCE_DOES_NOT_EXIST"
    assert not LoggedModel.objects.exists()
