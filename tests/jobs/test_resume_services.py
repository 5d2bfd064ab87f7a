"""Resume a stopped Job as a new Run: conditions, refusals, the latest-checkpoint rule, lineage
(docs/design/resume.md)."""

import pytest
from django.db import IntegrityError

from checkpoints.models import CheckpointState
from jobs import services
from jobs.models import Job, JobKind, JobStatus
from mado.errors import Conflict, Forbidden, NotFound, ValidationFailed
from runs.models import Run, RunKind, RunStatus
from tests.factories import CodeVersionFactory, RunFactory
from tests.jobs.conftest import checkpoint, launch, run_to_end


def snapshot(run: Run) -> dict:
    run.refresh_from_db()
    return {
        "status": run.status,
        "parameters": run.parameters,
        "name": run.name,
        "ended_at": run.ended_at,
        "parent": run.parent_id,
        "source_checkpoint": run.source_checkpoint_id,
        "inputs": sorted(run.input_dataset_versions.values_list("pk", flat=True)),
        "checkpoints": sorted(run.checkpoints.values_list("pk", "step", "state")),
    }


# --- who may resume ---------------------------------------------------------------


@pytest.mark.parametrize("role", ["creator", "admin"])
def test_the_creator_and_a_project_admin_may_resume(request, failed_job, role):
    actor = request.getfixturevalue(role)
    ckpt = checkpoint(failed_job.run, 20)
    job = services.run_resume_from_checkpoint(actor=actor, checkpoint=ckpt)
    assert job.kind == JobKind.RESUME and job.status == JobStatus.QUEUED
    assert job.run.created_by == actor and job.created_by == actor


def test_it_refuses_resume_by_a_viewer(failed_job, viewer):
    ckpt = checkpoint(failed_job.run, 20)
    with pytest.raises(Forbidden, match="viewer"):
        services.run_resume_from_checkpoint(actor=viewer, checkpoint=ckpt)
    assert not Job.objects.filter(kind=JobKind.RESUME).exists()


def test_it_refuses_resume_by_a_member_who_did_not_create_the_run(failed_job, member):
    ckpt = checkpoint(failed_job.run, 20)
    with pytest.raises(Forbidden, match="not your run"):
        services.run_resume_from_checkpoint(actor=member, checkpoint=ckpt)
    with pytest.raises(Forbidden, match="not your run"):
        services.job_resume_from_latest(actor=member, job=failed_job)
    assert not Job.objects.filter(kind=JobKind.RESUME).exists()


def test_it_refuses_resume_by_an_outsider(failed_job, outsider):
    ckpt = checkpoint(failed_job.run, 20)
    with pytest.raises(Forbidden, match="not a member"):
        services.run_resume_from_checkpoint(actor=outsider, checkpoint=ckpt)


# --- the source Run's state (docs/design/resume.md#who-may-resume) ----------------------------------------------------


def test_it_refuses_resume_of_a_running_job(creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="w")
    ckpt = checkpoint(job.run, 10)
    with pytest.raises(Conflict, match="still running"):
        services.run_resume_from_checkpoint(actor=creator, checkpoint=ckpt)
    with pytest.raises(Conflict, match="still running"):
        services.job_resume_from_latest(actor=creator, job=job)


def test_it_refuses_resume_of_a_queued_job(creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    with pytest.raises(Conflict, match="Job has not started yet"):
        services.run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint(job.run, 10))


def test_it_refuses_resume_of_a_finished_run_and_says_continue(creator, code_version, cpu):
    job = run_to_end(launch(creator, code_version, cpu), exit_code=0)
    assert job.status == JobStatus.SUCCEEDED
    with pytest.raises(Conflict, match="finished: use “Continue training"):
        services.run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint(job.run, 10))


def test_an_aborted_job_can_be_resumed(creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="w")
    services.job_abort(actor=creator, job=job)
    job = services.job_finish(job_id=job.pk, exit_code=-15, aborted=True)
    assert (job.status, job.run.status) == (JobStatus.ABORTED, RunStatus.ABORTED)
    new = services.run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint(job.run, 10))
    assert new.resumed_from == job.run


def test_it_refuses_resume_of_a_run_that_did_not_run_as_a_job(project, creator):
    run = RunFactory(project=project, created_by=creator, status=RunStatus.FAILED)
    with pytest.raises(Conflict, match="did not run as a Job"):
        services.run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint(run, 10))


@pytest.mark.parametrize("kind", [RunKind.EVALUATION, RunKind.OTHER])
def test_it_refuses_resume_of_a_run_that_is_not_training_or_fine_tuning(creator, code_version, cpu, kind):
    job = run_to_end(launch(creator, code_version, cpu, kind_of_run=kind))
    with pytest.raises(Conflict, match="Only training and fine-tuning"):
        services.run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint(job.run, 10))


# --- conditions (docs/design/resume.md#conditions) --------------------------------------------------------------------


def test_a_checkpoint_of_another_project_is_not_found(failed_job, creator, other_project):
    foreign_run = RunFactory(project=other_project)
    foreign = checkpoint(foreign_run, 50)
    with pytest.raises(NotFound) as caught:
        services.run_resume_from_checkpoint(actor=creator, checkpoint=foreign, source_run=failed_job.run)
    assert caught.value.field == "checkpoint"


def test_a_code_version_of_another_project_is_not_found(failed_job, creator, other_project):
    foreign = CodeVersionFactory(code__project=other_project)
    with pytest.raises(NotFound) as caught:
        services.run_resume_from_checkpoint(
            actor=creator, checkpoint=checkpoint(failed_job.run, 10), code_version=foreign
        )
    assert caught.value.field == "code_version_id"


def test_it_refuses_a_version_of_another_code(failed_job, creator, project):
    other_code = CodeVersionFactory(code__project=project, code__created_by=creator, code__name="other")
    with pytest.raises(ValidationFailed, match="must be a version of Code 'trainer'"):
        services.run_resume_from_checkpoint(
            actor=creator, checkpoint=checkpoint(failed_job.run, 10), code_version=other_code
        )


def test_it_refuses_a_checkpoint_from_a_run_of_another_code(failed_job, creator, project, cpu):
    other_version = CodeVersionFactory(code__project=project, code__created_by=creator, code__name="other")
    other = run_to_end(launch(creator, other_version, cpu))
    with pytest.raises(Conflict, match="code mismatch"):
        services.run_resume_from_checkpoint(
            actor=creator, checkpoint=checkpoint(other.run, 30), source_run=failed_job.run
        )


def test_it_refuses_a_checkpoint_from_a_run_of_another_kind(failed_job, creator, code_version, cpu):
    fine_tuning = run_to_end(launch(creator, code_version, cpu, kind_of_run=RunKind.FINE_TUNING))
    with pytest.raises(Conflict, match="kind mismatch"):
        services.run_resume_from_checkpoint(
            actor=creator, checkpoint=checkpoint(fine_tuning.run, 30), source_run=failed_job.run
        )


def test_any_version_of_the_same_code_may_run_the_resume(failed_job, creator, code_version):
    newer = CodeVersionFactory(code=code_version.code, version=2)
    job = services.run_resume_from_checkpoint(
        actor=creator, checkpoint=checkpoint(failed_job.run, 10), code_version=newer
    )
    assert job.code_version == newer and job.run.code_version == newer


def test_the_code_version_and_queue_default_to_the_source_jobs(failed_job, creator, gpu):
    job = services.run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint(failed_job.run, 10))
    assert (job.code_version, job.queue) == (failed_job.code_version, failed_job.queue)
    other = services.job_resume_from_latest(actor=creator, job=_fail(job), queue=gpu)
    assert other.queue == gpu


def _fail(job):
    return run_to_end(job, exit_code=1)


@pytest.mark.parametrize("state", [CheckpointState.PENDING, CheckpointState.DELETED])
def test_a_checkpoint_that_is_not_complete_cannot_be_used(failed_job, creator, state):
    ckpt = checkpoint(failed_job.run, 10, state=state)
    with pytest.raises(Conflict, match=f"is {state}, not complete"):
        services.run_resume_from_checkpoint(actor=creator, checkpoint=ckpt)
    assert not Job.objects.filter(kind=JobKind.RESUME).exists()


def test_a_disabled_queue_is_refused(failed_job, creator, gpu):
    gpu.enabled = False
    gpu.save()
    with pytest.raises(ValidationFailed) as caught:
        services.run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint(failed_job.run, 10), queue=gpu)
    assert caught.value.field == "queue"


# --- lineage, latest (docs/design/resume.md#lineage, #latest-checkpoint) ----------------------------------------------


def test_the_new_run_records_lineage_and_copies_inputs_and_the_source_is_unchanged(
    failed_job, creator, dataset_versions
):
    source = failed_job.run
    ckpt = checkpoint(source, 20)
    before = snapshot(source)
    job = services.run_resume_from_checkpoint(actor=creator, checkpoint=ckpt)
    run = job.run
    assert (run.parent, run.source_checkpoint, run.kind, run.status) == (source, ckpt, source.kind, RunStatus.PENDING)
    assert run.parameters == source.parameters == {"lr": 0.1}
    assert sorted(run.input_dataset_versions.values_list("pk", flat=True)) == sorted(v.pk for v in dataset_versions)
    assert job.resumed_from == source and job.attempt == 1 and job.retry_of is None
    assert "resumed from step 20" in run.name
    assert snapshot(source) == before
    failed_job.refresh_from_db()
    assert failed_job.status == JobStatus.FAILED


def test_a_resume_of_a_resume_names_the_first_run_once(failed_job, creator):
    failed_job.run.name = "resnet"
    failed_job.run.save(update_fields=["name"])
    first = services.run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint(failed_job.run, 20))
    run_to_end(first)
    second = services.run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint(first.run, 40))
    assert first.run.name == "resnet · resumed from step 20"
    assert second.run.name == "resnet · resumed from step 40"


def test_latest_is_the_complete_checkpoint_with_the_highest_step(failed_job, creator):
    run = failed_job.run
    checkpoint(run, 10)
    twenty = checkpoint(run, 20)
    checkpoint(run, 30, state=CheckpointState.PENDING)
    checkpoint(run, 40, state=CheckpointState.DELETED)
    job = services.job_resume_from_latest(actor=creator, job=failed_job)
    assert job.run.source_checkpoint == twenty


def test_a_resumed_run_without_checkpoints_inherits_its_source_checkpoint(failed_job, creator):
    twenty = checkpoint(failed_job.run, 20)
    resumed = _fail(services.job_resume_from_latest(actor=creator, job=failed_job))
    assert not resumed.run.checkpoints.exists()
    again = services.job_resume_from_latest(actor=creator, job=resumed)
    assert again.run.source_checkpoint == twenty
    assert again.run.parent == resumed.run and again.resumed_from == resumed.run


def test_a_resumed_run_with_its_own_checkpoints_uses_them(failed_job, creator):
    checkpoint(failed_job.run, 20)
    resumed = services.job_resume_from_latest(actor=creator, job=failed_job)
    own = checkpoint(resumed.run, 25)
    again = services.job_resume_from_latest(actor=creator, job=_fail(resumed))
    assert again.run.source_checkpoint == own


def test_it_refuses_resume_from_latest_without_any_checkpoint(failed_job, creator):
    checkpoint(failed_job.run, 10, state=CheckpointState.PENDING)
    with pytest.raises(Conflict, match="no complete checkpoint"):
        services.job_resume_from_latest(actor=creator, job=failed_job)
    assert not Job.objects.filter(kind=JobKind.RESUME).exists()


# --- double submission (docs/design/house.md#idempotent) ----------------------------------------------------------


def test_a_second_resume_while_the_first_is_active_is_refused_and_one_job_exists(failed_job, creator, admin):
    ckpt = checkpoint(failed_job.run, 20)
    first = services.run_resume_from_checkpoint(actor=creator, checkpoint=ckpt)
    with pytest.raises(Conflict) as caught:
        services.run_resume_from_checkpoint(actor=creator, checkpoint=ckpt)
    assert caught.value.extra == {"job_id": first.pk}
    with pytest.raises(Conflict, match=f"already being resumed by Job {first.pk}"):
        services.job_resume_from_latest(actor=admin, job=failed_job)
    assert Job.objects.filter(resumed_from=failed_job.run).count() == 1
    assert Run.objects.filter(parent=failed_job.run).count() == 1


def test_once_the_resume_failed_the_source_can_be_resumed_again(failed_job, creator):
    ckpt = checkpoint(failed_job.run, 20)
    _fail(services.run_resume_from_checkpoint(actor=creator, checkpoint=ckpt))
    second = services.run_resume_from_checkpoint(actor=creator, checkpoint=ckpt)
    assert Job.objects.filter(resumed_from=failed_job.run).count() == 2 and second.status == JobStatus.QUEUED


def test_the_database_refuses_a_second_active_resume_of_one_run(failed_job, creator):
    ckpt = checkpoint(failed_job.run, 20)
    first = services.run_resume_from_checkpoint(actor=creator, checkpoint=ckpt)
    run = RunFactory(project=failed_job.run.project, created_by=creator)
    with pytest.raises(IntegrityError):
        Job.objects.create(
            run=run,
            code_version=first.code_version,
            queue=first.queue,
            kind=JobKind.RESUME,
            created_by=creator,
            resumed_from=failed_job.run,
        )


def test_resume_is_dispatched_on_commit_to_the_chosen_queue(
    failed_job, creator, gpu, celery_calls, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        job = services.run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint(failed_job.run, 20), queue=gpu)
    assert celery_calls.sent == [
        {"name": "worker.tasks.run_job", "args": [job.pk], "queue": "gpu-a100", "task_id": job.celery_task_id}
    ]
