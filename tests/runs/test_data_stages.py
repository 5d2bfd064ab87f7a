"""``data_stage_record`` and the composition selectors (docs/design/runs.md#data-stages, #data-stages-sdk)."""

import pytest

from checkpoints.models import Checkpoint, CheckpointState
from jobs.models import JobKind, Queue
from jobs.services._common import create_job, record_job_ended
from mado.errors import Conflict, Forbidden, ValidationFailed
from runs.models import DataStage, RunStatus
from runs.selectors import data_composition_at, data_stage_history, why_cannot_record_stage
from runs.services import data_stage_record
from tests.factories import CodeVersionFactory, DatasetFactory, DatasetVersionFactory, RunFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def versions(project):
    digits = DatasetFactory(project=project, name="digits")
    synth = DatasetFactory(project=project, name="synth")
    return [
        DatasetVersionFactory(dataset=digits, version="v1"),
        DatasetVersionFactory(dataset=synth, version="v1"),
        DatasetVersionFactory(dataset=synth, version="v2"),
    ]


@pytest.fixture
def started(run, versions):
    run.input_dataset_versions.set([versions[0]])
    return run


def record(run, actor, step, versions, **kw):
    return data_stage_record(actor=actor, run=run, start_step=step, dataset_version_ids=[v.pk for v in versions], **kw)


def test_it_records_a_stage_and_keeps_the_initial_inputs(started, creator, versions):
    stage, created = record(started, creator, 15, versions[:2], metadata={"note": "synthetic"})
    assert created and stage.start_step == 15 and stage.created_by == creator
    assert set(stage.dataset_versions.all()) == set(versions[:2])
    assert list(started.input_dataset_versions.all()) == [versions[0]]


def test_identical_content_returns_the_same_record(started, creator, versions):
    first, _ = record(started, creator, 15, versions[:2], metadata={"note": "x"})
    again, created = record(started, creator, 15, list(reversed(versions[:2])), metadata={"note": "x"})
    assert (again.pk, created) == (first.pk, False)
    assert DataStage.objects.count() == 1


@pytest.mark.parametrize(
    "change",
    [
        {"versions": slice(0, 1)},
        {"metadata": {"note": "other"}},
    ],
)
def test_different_content_at_a_recorded_step_is_a_conflict_showing_the_recorded_set(
    started, creator, versions, change
):
    first, _ = record(started, creator, 15, versions[:2])
    with pytest.raises(Conflict) as error:
        record(started, creator, 15, versions[change.get("versions", slice(0, 2))], metadata=change.get("metadata"))
    assert error.value.extra["recorded"]["dataset_version_ids"] == sorted(v.pk for v in versions[:2])
    assert str(sorted(v.pk for v in versions[:2])) in error.value.detail
    assert DataStage.objects.count() == 1


def test_the_full_set_is_required(started, creator):
    with pytest.raises(ValidationFailed) as error:
        data_stage_record(actor=creator, run=started, start_step=1, dataset_version_ids=[])
    assert error.value.field == "input_dataset_version_ids"


def test_unknown_and_other_project_ids_are_named(started, creator, versions, other_project):
    foreign = DatasetVersionFactory(dataset__project=other_project)
    with pytest.raises(ValidationFailed) as error:
        data_stage_record(
            actor=creator, run=started, start_step=1, dataset_version_ids=[versions[0].pk, foreign.pk, 999999]
        )
    assert error.value.field == "input_dataset_version_ids"
    assert str(foreign.pk) in error.value.detail and "999999" in error.value.detail
    assert not DataStage.objects.exists()


@pytest.mark.parametrize("step", [-1, "3", True, None])
def test_start_step_must_be_a_non_negative_integer(started, creator, versions, step):
    with pytest.raises(ValidationFailed) as error:
        data_stage_record(actor=creator, run=started, start_step=step, dataset_version_ids=[versions[0].pk])
    assert error.value.field == "start_step"


def test_start_step_zero_is_allowed(started, creator, versions):
    assert record(started, creator, 0, versions[1:2])[1]


@pytest.mark.parametrize("step", [10, 15])
def test_start_step_must_follow_the_previous_stage(started, creator, versions, step):
    record(started, creator, 15, versions[:2])
    if step == 15:
        with pytest.raises(Conflict):
            record(started, creator, step, versions[:1])
    else:
        with pytest.raises(ValidationFailed) as error:
            record(started, creator, step, versions[:1])
        assert error.value.field == "start_step"


def test_the_checkpoint_must_be_of_the_run_and_not_after_start_step(started, creator, versions, project):
    own = Checkpoint.objects.create(run=started, step=20, state=CheckpointState.COMPLETE)
    other = Checkpoint.objects.create(run=RunFactory(project=project), step=5, state=CheckpointState.COMPLETE)
    for checkpoint, step in ((own, 15), (other, 15)):
        with pytest.raises(ValidationFailed) as error:
            record(started, creator, step, versions[:2], checkpoint_id=checkpoint.pk)
        assert error.value.field == "checkpoint_id"
    stage, _ = record(started, creator, 20, versions[:2], checkpoint_id=own.pk)
    assert stage.checkpoint == own


def test_metadata_must_be_an_object(started, creator, versions):
    with pytest.raises(ValidationFailed) as error:
        record(started, creator, 1, versions[:1], metadata=["x"])
    assert error.value.field == "metadata"


@pytest.mark.parametrize("status", [RunStatus.FINISHED, RunStatus.FAILED, RunStatus.CRASHED])
def test_it_is_refused_once_the_run_is_final(started, creator, versions, status):
    started.status = status
    started.save()
    with pytest.raises(Conflict, match="the Job has ended"):
        record(started, creator, 1, versions[:1])
    assert why_cannot_record_stage(user=creator, run=started)


def test_it_is_refused_once_the_runs_job_has_ended(started, creator, versions):
    """The jobs app writes "its Job ended" onto the Run (``record_job_ended``); the Run itself may still be live."""
    create_job(
        run=started,
        code_version=CodeVersionFactory(code__project=started.project),
        queue=Queue.objects.get_or_create(name="cpu")[0],
        kind=JobKind.NEW,
        created_by=creator,
        max_retries=0,
    )
    record_job_ended(run_id=started.pk)
    started.refresh_from_db()
    with pytest.raises(Conflict, match="the Job has ended"):
        record(started, creator, 1, versions[:1])


def test_an_identical_resend_after_the_end_still_returns_the_record(started, creator, versions):
    first, _ = record(started, creator, 5, versions[:2])
    started.status = RunStatus.FINISHED
    started.save()
    assert record(started, creator, 5, versions[:2]) == (first, False)


def test_viewers_and_outsiders_cannot_record(started, viewer, outsider, versions):
    for user in (viewer, outsider):
        with pytest.raises(Forbidden):
            record(started, user, 1, versions[:1])
        assert why_cannot_record_stage(user=user, run=started)


def test_the_creator_and_admins_may_record_other_members_may_not(started, member, admin, creator):
    for user in (admin, creator):
        assert why_cannot_record_stage(user=user, run=started) is None
    assert why_cannot_record_stage(user=member, run=started).startswith("This is not your run")


def test_composition_at_step_follows_the_stages(started, creator, versions):
    assert data_composition_at(run=started, step=0) == [versions[0]]
    record(started, creator, 15, versions[:2])
    record(started, creator, 30, [versions[0], versions[2]])
    assert data_composition_at(run=started, step=14) == [versions[0]]
    assert set(data_composition_at(run=started, step=15)) == set(versions[:2])
    assert set(data_composition_at(run=started, step=29)) == set(versions[:2])
    assert set(data_composition_at(run=started, step=1000)) == {versions[0], versions[2]}


def test_history_shows_what_each_stage_added_and_removed(started, creator, versions):
    record(started, creator, 15, versions[:2])
    record(started, creator, 30, [versions[0], versions[2]])
    history = data_stage_history(run=started)
    assert [h["stage"].start_step for h in history] == [15, 30]
    assert (history[0]["added"], history[0]["removed"]) == ([versions[1]], [])
    assert (history[1]["added"], history[1]["removed"]) == ([versions[2]], [versions[1]])
