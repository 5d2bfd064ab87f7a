"""``run_continue_from_checkpoint`` and ``POST checkpoints/{id}/continue/``
(docs/design/resume.md#continue, #continue-lineage)."""

import pytest

from checkpoints.models import CheckpointState
from jobs.models import JobKind, JobStatus
from jobs.services import run_continue_from_checkpoint
from mado import policy
from mado.errors import Conflict, Forbidden, NotFound, ValidationFailed
from runs.models import Run, RunKind, RunStatus
from tests.factories import CodeVersionFactory, DatasetVersionFactory, RunFactory, run_token
from tests.jobs.conftest import checkpoint, launch, run_to_end

pytestmark = pytest.mark.django_db


@pytest.fixture
def finished_job(creator, code_version, cpu, dataset_versions):
    job = launch(
        creator, code_version, cpu, dataset_version_ids=[dataset_versions[0].pk], kind_of_run=RunKind.FINE_TUNING
    )
    return run_to_end(job, exit_code=0)


@pytest.fixture
def ckpt(finished_job):
    return checkpoint(finished_job.run, 20)


def go(actor, ckpt, code_version, queue, ids, **kw):
    return run_continue_from_checkpoint(
        actor=actor,
        checkpoint=ckpt,
        code_version=code_version,
        queue=queue,
        dataset_version_ids=[v.pk for v in ids],
        **kw,
    )


def test_it_creates_a_continue_job_whose_run_records_lineage_and_chosen_data(
    member, ckpt, code_version, cpu, dataset_versions, finished_job, celery_calls, django_capture_on_commit_callbacks
):
    source = finished_job.run
    before = (source.status, list(source.input_dataset_versions.all()), source.parameters)
    with django_capture_on_commit_callbacks(execute=True):
        job = go(member, ckpt, code_version, cpu, dataset_versions, parameters={"lr": 0.01})
    run = job.run
    assert (job.kind, job.status, job.resumed_from_id, job.created_by) == (
        JobKind.CONTINUE,
        JobStatus.QUEUED,
        source.pk,
        member,
    )
    assert (run.status, run.kind, run.parent_id, run.source_checkpoint_id) == (
        RunStatus.PENDING,
        RunKind.FINE_TUNING,
        source.pk,
        ckpt.pk,
    )
    assert set(run.input_dataset_versions.all()) == set(dataset_versions)
    assert run.parameters == {"lr": 0.01} and "continued from step 20" in run.name
    assert celery_calls.sent[-1]["args"] == [job.pk] and celery_calls.sent[-1]["queue"] == "cpu"
    source = Run.objects.get(pk=source.pk)
    assert (source.status, list(source.input_dataset_versions.all()), source.parameters) == before


def test_parameters_default_to_the_sources(member, ckpt, code_version, cpu, dataset_versions):
    assert go(member, ckpt, code_version, cpu, dataset_versions).run.parameters == {"lr": 0.1}


def test_it_works_from_a_run_without_a_job_in_any_state(member, project, cpu, dataset_versions):
    source = RunFactory(project=project, status=RunStatus.RUNNING)
    other_code_version = CodeVersionFactory(code__project=project)
    job = go(member, checkpoint(source, 10), other_code_version, cpu, dataset_versions[:1])
    assert job.run.parent == source and job.kind == JobKind.CONTINUE


def test_a_code_version_of_another_code_is_refused(member, ckpt, project, cpu, dataset_versions):
    with pytest.raises(ValidationFailed) as error:
        go(member, ckpt, CodeVersionFactory(code__project=project), cpu, dataset_versions)
    assert error.value.field == "code_version_id"


def test_another_version_of_the_same_code_is_accepted(member, ckpt, code_version, cpu, dataset_versions):
    v2 = CodeVersionFactory(code=code_version.code, version=2)
    assert go(member, ckpt, v2, cpu, dataset_versions).code_version == v2


def test_a_code_version_of_another_project_is_not_found(member, ckpt, other_project, cpu, dataset_versions):
    with pytest.raises(NotFound):
        go(member, ckpt, CodeVersionFactory(code__project=other_project), cpu, dataset_versions)


@pytest.mark.parametrize("state", [CheckpointState.PENDING, CheckpointState.DELETED])
def test_a_pending_or_deleted_checkpoint_is_refused(member, finished_job, code_version, cpu, dataset_versions, state):
    with pytest.raises(Conflict):
        go(member, checkpoint(finished_job.run, 30, state=state), code_version, cpu, dataset_versions)
    assert Run.objects.count() == 1


def test_dataset_versions_of_another_project_are_named(member, ckpt, code_version, cpu, other_project):
    foreign = DatasetVersionFactory(dataset__project=other_project)
    with pytest.raises(ValidationFailed) as error:
        go(member, ckpt, code_version, cpu, [foreign])
    assert error.value.field == "input_dataset_version_ids" and str(foreign.pk) in error.value.detail


def test_viewers_cannot_continue(viewer, ckpt, code_version, cpu, dataset_versions):
    assert policy.why_cannot_continue(viewer, ckpt)
    with pytest.raises(Forbidden):
        go(viewer, ckpt, code_version, cpu, dataset_versions)


def test_policy_allows_members_and_admins(member, admin, ckpt):
    assert policy.why_cannot_continue(member, ckpt) is None and policy.why_cannot_continue(admin, ckpt) is None


def test_a_disabled_queue_is_refused(member, ckpt, code_version, gpu, dataset_versions):
    gpu.enabled = False
    gpu.save()
    with pytest.raises(ValidationFailed) as error:
        go(member, ckpt, code_version, gpu, dataset_versions)
    assert error.value.field == "queue"


# --- API -------------------------------------------------------------------------------


def continue_url(ckpt):
    return f"/api/v1/checkpoints/{ckpt.pk}/continue/"


@pytest.mark.parametrize(
    "role, expected",
    [
        ("member", 201),
        ("admin", 201),
        ("creator", 201),
        ("viewer", 403),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_api_permissions(client_as, ckpt, code_version, cpu, dataset_versions, role, expected):
    body = {"code_version_id": code_version.pk, "input_dataset_version_ids": [v.pk for v in dataset_versions]}
    response = client_as(role).post(continue_url(ckpt), body, format="json")
    assert response.status_code == expected, response.content
    if expected == 201:
        data = response.json()
        assert data["kind"] == "continue" and data["source_checkpoint_id"] == ckpt.pk
        assert data["resumed_from_run_id"] == ckpt.run_id and data["queue"] == "cpu"


def test_api_refuses_a_code_version_of_another_code_with_400(api, member, ckpt, project, cpu, dataset_versions):
    body = {"code_version_id": CodeVersionFactory(code__project=project).pk, "input_dataset_version_ids": []}
    response = api(member).post(continue_url(ckpt), body, format="json")
    assert response.status_code == 400 and response.json()["field"] == "code_version_id"


def test_api_refuses_a_pending_checkpoint_with_409(api, member, finished_job, code_version, cpu):
    pending = checkpoint(finished_job.run, 30, state=CheckpointState.PENDING)
    response = api(member).post(
        continue_url(pending), {"code_version_id": code_version.pk, "input_dataset_version_ids": []}, format="json"
    )
    assert response.status_code == 409


def test_a_jobs_run_token_cannot_continue(client, ckpt, code_version, cpu, finished_job):

    token = run_token(ckpt.run, finished_job.created_by)
    response = client.post(
        continue_url(ckpt),
        {"code_version_id": code_version.pk, "input_dataset_version_ids": []},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token.key}",
    )
    assert response.status_code == 403
