"""The model registry in the audit log (docs/api.md#audit): each change to an existing model, version or alias is
one record with its actor, Project and ``{field: [before, after]}``; creating is not a record, and a request that
changes nothing or is refused records nothing."""

import pytest

from mado.models import AuditEvent
from mlflow_api.models import ModelAlias
from mlflow_api.registry import services
from tests.jobs.conftest import checkpoint

pytestmark = pytest.mark.django_db
ML = "/api/2.0/mlflow/"


def _records() -> list[tuple[str, str, str, dict]]:
    """The records, but the API tokens the ``api`` fixture makes for each client."""
    events = AuditEvent.objects.exclude(action="token.create").order_by("pk")
    return [(e.action, e.actor_name, e.object_repr, e.changes) for e in events]


@pytest.fixture
def versions(run, member):
    """Model ``resnet`` in the run's Project with versions 1 and 2 (from two checkpoints); no record yet."""
    first = services.checkpoint_register(actor=member, checkpoint=checkpoint(run, 10), name="resnet")
    second = services.checkpoint_register(actor=member, checkpoint=checkpoint(run, 20), name="resnet")
    assert _records() == []
    return first, second


def test_moving_an_alias_is_recorded_with_the_versions_and_setting_it_again_is_not(versions, admin, api, run):
    model = {"name": "resnet"}
    for version in ("1", "1", "2"):  # set, the same again (a double click), moved
        answer = api(admin).post(
            ML + "registered-models/alias", {**model, "alias": "prod", "version": version}, format="json"
        )
        assert answer.status_code == 200, answer.content
    for _ in range(2):  # deleted, then already gone: 200 and nothing recorded, as an MLflow server answers
        answer = api(admin).delete(ML + "registered-models/alias", {**model, "alias": "prod"}, format="json")
        assert answer.status_code == 200, answer.content
    assert _records() == [
        ("model_alias.set", admin.username, "resnet@prod", {"version": [None, 1]}),
        ("model_alias.set", admin.username, "resnet@prod", {"version": [1, 2]}),
        ("model_alias.delete", admin.username, "resnet@prod", {"version": [2, None]}),
    ]
    event = AuditEvent.objects.filter(action="model_alias.set").order_by("pk").first()
    assert event.project_id == run.project_id and event.request_id and event.actor_kind == "user"
    assert not ModelAlias.objects.exists()


def test_descriptions_tags_names_and_deletions_are_recorded_once_each(versions, member, admin, api):
    version = {"name": "resnet", "version": "1"}
    calls = [
        (member, "patch", "registered-models/update", {"name": "resnet", "description": "digits"}),
        (member, "patch", "registered-models/update", {"name": "resnet", "description": "digits"}),  # no change
        (member, "post", "registered-models/set-tag", {"name": "resnet", "key": "team", "value": "vision"}),
        (member, "delete", "registered-models/delete-tag", {"name": "resnet", "key": "team"}),
        (member, "patch", "model-versions/update", {**version, "description": "baseline"}),
        (member, "post", "model-versions/set-tag", {**version, "key": "reviewed", "value": "yes"}),
        (member, "post", "model-versions/set-tag", {**version, "key": "reviewed", "value": "no"}),
        (member, "delete", "model-versions/delete-tag", {**version, "key": "reviewed"}),
        (member, "delete", "model-versions/delete-tag", {**version, "key": "reviewed"}),  # absent now: no-op
        (member, "post", "registered-models/rename", {"name": "resnet", "new_name": "resnet-50"}),  # admins only
        (admin, "post", "registered-models/rename", {"name": "resnet", "new_name": "resnet-50"}),
        (admin, "delete", "model-versions/delete", {"name": "resnet-50", "version": "1"}),
        (admin, "delete", "registered-models/delete", {"name": "resnet-50"}),
    ]
    statuses = [
        getattr(api(user), verb)(ML + path, body, format="json").status_code for user, verb, path, body in calls
    ]
    assert statuses == [200] * 9 + [403, 200, 200, 200]
    m, a = member.username, admin.username
    assert _records() == [
        ("registered_model.update", m, "resnet", {"description": ["", "digits"]}),
        ("registered_model.set_tag", m, "resnet", {"tags.team": [None, "vision"]}),
        ("registered_model.delete_tag", m, "resnet", {"tags.team": ["vision", None]}),
        ("model_version.update", m, "resnet v1", {"description": ["", "baseline"]}),
        ("model_version.set_tag", m, "resnet v1", {"tags.reviewed": [None, "yes"]}),
        ("model_version.set_tag", m, "resnet v1", {"tags.reviewed": ["yes", "no"]}),
        ("model_version.delete_tag", m, "resnet v1", {"tags.reviewed": ["no", None]}),
        ("registered_model.rename", a, "resnet-50", {"name": ["resnet", "resnet-50"]}),
        ("model_version.delete", a, "resnet-50 v1", {}),
        ("registered_model.delete", a, "resnet-50", {}),
    ]


def test_creating_models_and_versions_is_not_a_record(run, member, api):
    services.checkpoint_register(actor=member, checkpoint=checkpoint(run, 10), name="resnet")
    created = api(member).post(ML + "registered-models/create", {"name": "other"}, format="json")
    assert created.status_code == 200
    assert _records() == []
