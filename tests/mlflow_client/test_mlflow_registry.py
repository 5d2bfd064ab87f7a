"""The MLflow model registry through the stock client against mado (docs/api.md#model-registry).

``log_model(registered_model_name=…)``, ``register_model("runs:/…")``,
aliases, version tags and ``load_model("models:/<name>@<alias>")`` answer as
on an MLflow server; a checkpoint behind a version cannot be deleted.
"""

import pytest

mlflow = pytest.importorskip("mlflow")
torch = pytest.importorskip("torch")
pytest.importorskip("pandas")  # mlflow.pytorch imports it

import mlflow.pytorch  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402

from mlflow_api.models import ModelVersion, RegisteredModel  # noqa: E402
from runs.models import Project  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


EXAMPLE = torch.randn(2, 4).numpy()


def _net(seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))


def test_register_from_a_run_set_an_alias_and_load_it_by_alias(mlflow_env, tmp_path):
    first, second, sample = _net(0), _net(1), torch.randn(5, 4)
    experiment_id = mlflow.set_experiment("Registry").experiment_id
    with mlflow.start_run() as active:
        info = mlflow.pytorch.log_model(first, name="net", registered_model_name="digits", input_example=EXAMPLE)
    assert str(info.registered_model_version) == "1"
    with mlflow.start_run() as other:
        mlflow.pytorch.log_model(second, name="net", input_example=EXAMPLE)
    version = mlflow.register_model(f"runs:/{other.info.run_id}/net", "digits", tags={"data": "v2"})
    assert (version.name, version.version, version.run_id) == ("digits", "2", other.info.run_id)

    client = mlflow.tracking.MlflowClient()
    client.set_registered_model_alias("digits", "champion", "1")
    client.set_model_version_tag("digits", "1", "reviewed", "yes")
    by_alias = client.get_model_version_by_alias("digits", "champion")
    assert (by_alias.version, by_alias.run_id, by_alias.aliases) == ("1", active.info.run_id, ["champion"])
    assert by_alias.tags == {"reviewed": "yes"}
    assert ModelVersion.objects.get(version=1).logged_model.model_id == info.model_id  # the client drops model_id
    model = client.get_registered_model("digits")
    assert model.aliases == {"champion": "1"} and [v.version for v in model.latest_versions] == ["2"]
    assert RegisteredModel.objects.get(name="digits").project == Project.objects.get(pk=int(experiment_id))

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    loaded = mlflow.pytorch.load_model("models:/digits@champion", dst_path=str(tmp_path / "a"))
    assert torch.equal(loaded(sample), first(sample))
    loaded = mlflow.pytorch.load_model("models:/digits/2", dst_path=str(tmp_path / "b"))
    assert torch.equal(loaded(sample), second(sample))

    # Moving the alias changes what serving code loads; deleting it makes the alias unknown: 400, as on MLflow.
    client.set_registered_model_alias("digits", "champion", "2")
    assert client.get_model_version_by_alias("digits", "champion").version == "2"
    client.delete_registered_model_alias("digits", "champion")
    with pytest.raises(MlflowException, match="INVALID_PARAMETER_VALUE: Registered model alias champion not found"):
        client.get_model_version_by_alias("digits", "champion")
    client.delete_registered_model_alias("digits", "champion")  # already gone: nothing to do, as on MLflow


def test_search_update_and_delete_answer_as_mlflow_does(mlflow_env):
    mlflow.set_experiment("Registry search")
    with mlflow.start_run() as active:
        mlflow.pytorch.log_model(_net(0), name="net", registered_model_name="alpha", input_example=EXAMPLE)
    client = mlflow.tracking.MlflowClient()
    client.create_registered_model("beta", tags={"team": "vision"}, description="second")
    assert [m.name for m in client.search_registered_models(filter_string="name LIKE 'al%'")] == ["alpha"]
    assert [m.name for m in client.search_registered_models(filter_string="tags.team = 'vision'")] == ["beta"]
    found = client.search_model_versions(f"run_id = '{active.info.run_id}'")
    assert [(v.name, v.version) for v in found] == [("alpha", "1")]
    assert client.get_latest_versions("alpha")[0].version == "1"
    client.update_registered_model("alpha", description="the first")
    client.update_model_version("alpha", "1", description="baseline")
    assert client.get_registered_model("alpha").description == "the first"
    assert client.get_model_version("alpha", "1").description == "baseline"
    client.rename_registered_model("beta", "gamma")
    assert client.get_registered_model("gamma").tags == {"team": "vision"}
    with pytest.raises(MlflowException, match="already exists"):
        client.create_registered_model("alpha")

    client.delete_model_version("alpha", "1")
    with pytest.raises(MlflowException, match="not found"):
        client.get_model_version("alpha", "1")
    client.delete_registered_model("alpha")
    assert not RegisteredModel.objects.filter(name="alpha").exists() and not ModelVersion.objects.exists()
