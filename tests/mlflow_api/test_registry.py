"""The model registry's rules (docs/api.md#model-registry): who registers, who moves aliases and deletes, where a
model lives, and that a checkpoint behind a registered version cannot be deleted."""

import hashlib
import io

import pytest
from django.test import override_settings

from checkpoints import services as checkpoint_services
from checkpoints.models import Checkpoint, CheckpointState
from mado.errors import Conflict
from mlflow_api.models import ModelVersion, RegisteredModel
from mlflow_api.registry import services
from mlflow_api.tracking.logged_models import logged_model_create
from tests.checkpoints.checkpoint_helpers import declaration, make_tar
from tests.factories import RunFactory
from tests.jobs.conftest import checkpoint

pytestmark = pytest.mark.django_db
ML = "/api/2.0/mlflow/"


def _register(user, ckpt, name="resnet"):
    return services.checkpoint_register(actor=user, checkpoint=ckpt, name=name)


@override_settings(MMT_CHECKPOINT_KEEP_COUNT=1)
def test_a_registered_checkpoint_cannot_be_deleted_until_its_version_is(run, member, admin, api):
    old, _newest = checkpoint(run, 10), checkpoint(run, 20)
    version = _register(member, old)
    old.refresh_from_db()
    assert old.registered_as == "resnet v1" and version.registered_model.project == run.project

    with pytest.raises(Conflict, match="registered as model version resnet v1 and cannot be deleted"):
        checkpoint_services.checkpoint_delete(actor=admin, checkpoint=old)
    answer = api(admin).delete(f"/api/v1/checkpoints/{old.pk}/")
    assert answer.status_code == 409 and "delete that model version first" in answer.json()["detail"]
    assert Checkpoint.objects.get(pk=old.pk).state == CheckpointState.COMPLETE

    deleted = api(admin).delete(ML + "model-versions/delete", {"name": "resnet", "version": "1"}, format="json")
    assert deleted.status_code == 200
    old.refresh_from_db()
    assert old.registered_as == ""
    assert checkpoint_services.checkpoint_delete(actor=admin, checkpoint=old).state == CheckpointState.DELETED


def test_the_checkpoint_tab_says_why_a_registered_checkpoint_stays(run, member, admin, login, settings):
    settings.MMT_CHECKPOINT_KEEP_COUNT = 1
    old, _newest = checkpoint(run, 10), checkpoint(run, 20)
    _register(member, old)
    page = login(admin).get(f"/runs/{run.pk}/checkpoints/?older=1").content.decode()
    assert "registered: resnet v1" in page
    assert "The checkpoint at step 10 is registered as model version resnet v1 and cannot be deleted" in page
    detail = login(admin).get(f"/checkpoints/{old.pk}/").content.decode()
    assert "model version resnet v1" in detail and "delete that model version first" in detail


def test_a_viewer_cannot_register_and_a_pending_checkpoint_is_refused(run, viewer, member, login):
    complete, pending = checkpoint(run, 10), checkpoint(run, 20, state=CheckpointState.PENDING)
    refused = login(viewer).post(f"/checkpoints/{complete.pk}/register/", {"name": "resnet"})
    assert refused.status_code == 403 and not RegisteredModel.objects.exists()
    form = login(member).post(f"/checkpoints/{pending.pk}/register/", {"name": "resnet"}).content.decode()
    assert "only a complete checkpoint can be registered" in form and not ModelVersion.objects.exists()
    done = login(member).post(f"/checkpoints/{complete.pk}/register/", {"name": "resnet"})
    assert done.status_code == 302 and ModelVersion.objects.get().checkpoint == complete
    again = login(member).post(f"/checkpoints/{complete.pk}/register/", {"name": "resnet"})  # a double click
    assert again.status_code == 302 and ModelVersion.objects.count() == 1
    login(member).post(f"/checkpoints/{complete.pk}/register/", {"name": "candidates"})  # another model
    assert Checkpoint.objects.get(pk=complete.pk).registered_as == "resnet v1, candidates v1"


def test_members_register_admins_move_aliases_and_outsiders_see_nothing(run, member, admin, outsider, api):
    _register(member, checkpoint(run, 10))
    alias = {"name": "resnet", "alias": "champion", "version": "1"}
    refused = api(member).post(ML + "registered-models/alias", alias, format="json")
    assert refused.status_code == 403 and refused.json()["error_code"] == "PERMISSION_DENIED"
    assert api(admin).post(ML + "registered-models/alias", alias, format="json").status_code == 200
    got = api(member).get(ML + "registered-models/alias", {"name": "resnet", "alias": "champion"}).json()
    assert got["model_version"]["version"] == "1" and got["model_version"]["aliases"] == ["champion"]
    hidden = api(outsider).get(ML + "registered-models/get", {"name": "resnet"})
    assert hidden.status_code == 404 and hidden.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"
    taken = api(outsider).post(ML + "registered-models/create", {"name": "resnet"}, format="json")
    assert taken.status_code == 400 and taken.json()["message"] == "this model name cannot be used: choose another"
    bad = api(admin).post(ML + "registered-models/alias", {**alias, "alias": "latest"}, format="json")
    assert bad.status_code == 400 and "alias" in bad.json()["message"]


def test_a_model_takes_the_project_of_its_first_version_and_refuses_another(run, member, other_project, api):
    other_run = RunFactory(project=other_project, created_by=member, name="elsewhere")
    other_project.memberships.create(user=member, role="member")
    assert api(member).post(ML + "registered-models/create", {"name": "loose"}, format="json").status_code == 200
    assert RegisteredModel.objects.get(name="loose").project is None
    create = {"name": "loose", "source": "runs:/x/net"}
    assert (
        api(member).post(ML + "model-versions/create", {**create, "run_id": run.external_id}, format="json").status_code
        == 200
    )
    assert RegisteredModel.objects.get(name="loose").project == run.project
    refused = api(member).post(ML + "model-versions/create", {**create, "run_id": other_run.external_id}, format="json")
    assert refused.status_code == 400 and "belongs to another experiment" in refused.json()["message"]
    assert ModelVersion.objects.count() == 1


def test_a_checkpoint_version_downloads_the_checkpoints_verified_tar(run, creator, api):
    files = {"model.pt": b"weights" * 1000}
    tar = make_tar(files)
    ckpt, _ = checkpoint_services.checkpoint_register(actor=creator, run=run, step=5, framework="torch")
    checkpoint_services.checkpoint_upload(
        actor=creator, checkpoint=ckpt, source=io.BytesIO(tar), expected_size=len(tar)
    )
    ckpt = checkpoint_services.checkpoint_complete(actor=creator, checkpoint=ckpt, **declaration(tar, files))
    _register(creator, ckpt)

    uri = api(creator).get(ML + "model-versions/get-download-uri", {"name": "resnet", "version": "1"}).json()
    assert uri == {
        "artifact_uri": f"mlflow-artifacts:/{run.project_id}/{run.external_id}/artifacts/checkpoints/step-5.tar"
    }
    path = uri["artifact_uri"].removeprefix("mlflow-artifacts:/")
    got = api(creator).get(f"/api/2.0/mlflow-artifacts/artifacts/{path}")
    body = b"".join(got.streaming_content)
    assert got.status_code == 200 and hashlib.sha256(body).hexdigest() == ckpt.tar_sha256


def test_a_member_registers_a_model_another_member_logged(run, creator, member, api):
    logged = logged_model_create(actor=creator, project=run.project, name="net", source_run=run)
    create = {"name": "shared", "source": f"models:/{logged.model_id}", "model_id": logged.model_id}
    assert api(member).post(ML + "registered-models/create", {"name": "shared"}, format="json").status_code == 200
    assert api(member).post(ML + "model-versions/create", create, format="json").status_code == 200
    # What register_model then does: record the version on the logged model; only that tag is open to members.
    link = [{"key": "mlflow.modelVersions", "value": '[{"name": "shared", "version": "1"}]'}]
    tags = f"{ML}logged-models/{logged.model_id}/tags"
    assert api(member).patch(tags, {"tags": link}, format="json").status_code == 200
    other = api(member).patch(tags, {"tags": [{"key": "stage", "value": "prod"}]}, format="json")
    assert other.status_code == 403
    assert ModelVersion.objects.get().run == run and RegisteredModel.objects.get().project == run.project


def test_a_search_page_costs_the_same_few_queries_whatever_its_size(run, member, api, django_assert_max_num_queries):
    for index in range(30):
        _register(member, checkpoint(run, index), name=f"model-{index:02d}")
    client = api(member)
    with django_assert_max_num_queries(12):
        found = client.get(ML + "registered-models/search", {"max_results": 50}).json()["registered_models"]
    assert [m["name"] for m in found] == [f"model-{i:02d}" for i in range(30)]
    assert found[3]["latest_versions"][0]["version"] == "1"
    with django_assert_max_num_queries(12):
        versions = client.get(ML + "model-versions/search", {"max_results": 50}).json()["model_versions"]
    assert len(versions) == 30 and versions[0]["run_id"] == run.external_id
