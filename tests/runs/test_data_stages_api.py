"""``runs/{id}/data-stages/`` (docs/design/runs.md#data-stages, #data-stages-sdk): permission matrix, idempotency,
conflicts, ``?at_step``."""

import pytest

from runs.models import DataStage, RunStatus
from tests.factories import DatasetFactory, DatasetVersionFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def versions(project, run):
    digits, synth = DatasetFactory(project=project, name="digits"), DatasetFactory(project=project, name="synth")
    made = [DatasetVersionFactory(dataset=digits, version="v1"), DatasetVersionFactory(dataset=synth, version="v1")]
    run.input_dataset_versions.set([made[0]])
    return made


def url(run):
    return f"/api/v1/runs/{run.pk}/data-stages/"


def body(versions, step=15, **extra):
    return {"start_step": step, "input_dataset_version_ids": [v.pk for v in versions], **extra}


@pytest.mark.parametrize(
    "role, expected",
    [
        ("creator", 201),
        ("member", 403),
        ("admin", 201),
        ("viewer", 403),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_post_permissions(client_as, run, versions, role, expected):
    response = client_as(role).post(url(run), body(versions), format="json")
    assert response.status_code == expected, response.content
    assert DataStage.objects.count() == (1 if expected == 201 else 0)


@pytest.mark.parametrize("role, expected", [("viewer", 200), ("outsider", 404), ("anonymous", 401)])
def test_get_permissions(client_as, run, versions, role, expected):
    assert client_as(role).get(url(run)).status_code == expected


def test_post_returns_the_stage_with_its_diff_and_a_resend_returns_it_with_200(api, creator, run, versions):
    client = api(creator)
    first = client.post(url(run), body(versions, metadata={"note": "synthetic"}), format="json")
    assert first.status_code == 201
    data = first.json()
    assert data["start_step"] == 15 and data["dataset_version_ids"] == sorted(v.pk for v in versions)
    assert [v["id"] for v in data["added"]] == [versions[1].pk] and data["removed"] == []
    assert data["metadata"] == {"note": "synthetic"} and data["created_by"] == "carol-creator"
    again = client.post(url(run), body(versions, metadata={"note": "synthetic"}), format="json")
    assert again.status_code == 200 and again.json()["id"] == data["id"]
    assert DataStage.objects.count() == 1


def test_a_different_set_at_a_recorded_step_answers_409_with_the_recorded_set(api, creator, run, versions):
    client = api(creator)
    client.post(url(run), body(versions), format="json")
    response = client.post(url(run), body(versions[:1]), format="json")
    assert response.status_code == 409
    assert response.json()["recorded"]["dataset_version_ids"] == sorted(v.pk for v in versions)


@pytest.mark.parametrize("ids", [[], [999999]])
def test_bad_sets_answer_400_naming_the_field_and_ids(api, creator, run, ids):
    response = api(creator).post(url(run), {"start_step": 1, "input_dataset_version_ids": ids}, format="json")
    assert response.status_code == 400
    assert response.json()["field"] == "input_dataset_version_ids"
    if ids:
        assert "999999" in response.json()["detail"]


def test_another_projects_ids_answer_400(api, creator, run, other_project):
    foreign = DatasetVersionFactory(dataset__project=other_project)
    response = api(creator).post(url(run), {"start_step": 1, "input_dataset_version_ids": [foreign.pk]}, format="json")
    assert response.status_code == 400 and str(foreign.pk) in response.json()["detail"]


def test_a_final_run_answers_409_the_job_has_ended(api, creator, run, versions):
    run.status = RunStatus.FINISHED
    run.save()
    response = api(creator).post(url(run), body(versions), format="json")
    assert response.status_code == 409 and "the Job has ended" in response.json()["detail"]


def test_stages_cannot_be_changed_or_deleted(api, admin, run, versions):
    client = api(admin)
    client.post(url(run), body(versions), format="json")
    for method in ("put", "patch", "delete"):
        assert getattr(client, method)(url(run), body(versions[:1]), format="json").status_code == 405
    assert DataStage.objects.count() == 1


def test_get_lists_the_history_and_at_step_the_composition(api, creator, viewer, run, versions):
    api(creator).post(url(run), body(versions), format="json")
    history = api(viewer).get(url(run)).json()
    assert [v["id"] for v in history["initial_dataset_versions"]] == [versions[0].pk]
    assert [s["start_step"] for s in history["results"]] == [15]
    before = api(viewer).get(url(run), {"at_step": 14}).json()
    after = api(viewer).get(url(run), {"at_step": 15}).json()
    assert before["dataset_version_ids"] == [versions[0].pk]
    assert after["dataset_version_ids"] == sorted(v.pk for v in versions) and after["step"] == 15
    assert api(viewer).get(url(run), {"at_step": "x"}).status_code == 400
