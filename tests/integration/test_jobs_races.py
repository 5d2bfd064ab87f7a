"""Races on a real PostgreSQL around Jobs (docs/design/house.md#idempotent, docs/design/checkpoints.md#deletion;
docs/design/resume.md#who-may-resume; docs/design/worker.md#subprocess).

Two resumes of one failed Run at once create exactly one Job; a resume and
the deletion of its checkpoint never both win; a worker's claim and an
abort of the queued Job end in one consistent state; the worker's finish
and the reaper end a Job once.
"""

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from checkpoints import services as checkpoint_services
from checkpoints.models import Checkpoint, CheckpointState
from jobs import services
from jobs.models import Job, JobKind, JobStatus, Queue
from mado.errors import Conflict
from runs.models import Run, RunStatus
from tests.factories import CodeVersionFactory
from tests.integration.concurrency import together

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def failed_job(postgres, project, creator, admin):
    version = CodeVersionFactory(code__project=project, code__created_by=creator)
    job = services.job_launch(
        actor=creator,
        code_version=version,
        queue=Queue.objects.get_or_create(name="cpu")[0],
        parameters={},
        dataset_version_ids=[],
    )
    services.job_claim(job_id=job.pk, worker_host="w")
    return services.job_finish(job_id=job.pk, exit_code=1)


def complete_checkpoint(run, step) -> Checkpoint:
    return Checkpoint.objects.create(run=run, step=step, state=CheckpointState.COMPLETE)


def test_two_resumes_at_once_create_exactly_one_job(failed_job, creator, admin):
    for round_ in range(5):
        Job.objects.filter(kind=JobKind.RESUME).update(status=JobStatus.FAILED, ended_at=timezone.now())
        ckpt = complete_checkpoint(failed_job.run, 10 + round_)
        outcomes = together(
            (services.run_resume_from_checkpoint, {"actor": creator, "checkpoint": ckpt}),
            (services.job_resume_from_latest, {"actor": admin, "job": failed_job}),
            (services.run_resume_from_checkpoint, {"actor": admin, "checkpoint": ckpt}),
        )
        created = [result for result, error in outcomes if error is None]
        errors = [error for result, error in outcomes if error is not None]
        assert len(created) == 1, outcomes
        assert all(isinstance(e, Conflict) and e.extra == {"job_id": created[0].pk} for e in errors), errors
        active = Job.objects.filter(resumed_from=failed_job.run, status=JobStatus.QUEUED)
        assert list(active) == [created[0]]
    assert Run.objects.filter(parent=failed_job.run).count() == 5
    failed_job.run.refresh_from_db()
    assert failed_job.run.status == RunStatus.FAILED


def test_a_resume_and_the_deletion_of_its_checkpoint_never_both_win(failed_job, creator, admin, settings):
    settings.MMT_CHECKPOINT_KEEP_COUNT = 1
    for step in range(1, 8):
        complete_checkpoint(failed_job.run, step)
    complete_checkpoint(failed_job.run, 100)  # the kept one: steps 1..7 may be deleted
    for step in range(1, 8):
        Job.objects.filter(kind=JobKind.RESUME).update(status=JobStatus.FAILED, ended_at=timezone.now())
        target = Checkpoint.objects.get(run=failed_job.run, step=step)
        (job, resume_error), (_, delete_error) = together(
            (services.run_resume_from_checkpoint, {"actor": creator, "checkpoint": target}),
            (checkpoint_services.checkpoint_delete, {"actor": admin, "checkpoint": target}),
        )
        state = Checkpoint.objects.get(pk=target.pk).state
        assert (resume_error is None) != (delete_error is None), (resume_error, delete_error)
        if resume_error is None:
            assert state == CheckpointState.COMPLETE and job.run.source_checkpoint_id == target.pk
            assert isinstance(delete_error, Conflict) and "source checkpoint" in delete_error.detail
        else:
            assert state == CheckpointState.DELETED
            assert isinstance(resume_error, Conflict) and "not complete" in resume_error.detail
    assert not Run.objects.filter(source_checkpoint__state=CheckpointState.DELETED).exists()


def test_claim_and_abort_of_a_queued_job_end_consistently(postgres, project, creator):
    version = CodeVersionFactory(code__project=project, code__created_by=creator)
    cpu = Queue.objects.get_or_create(name="cpu")[0]
    for _ in range(8):
        job = services.job_launch(actor=creator, code_version=version, queue=cpu, parameters={}, dataset_version_ids=[])
        (claimed, claim_error), (aborted, abort_error) = together(
            (services.job_claim, {"job_id": job.pk, "worker_host": "w"}),
            (services.job_abort, {"actor": creator, "job": job}),
        )
        assert claim_error is None and abort_error is None
        job.refresh_from_db()
        assert job.abort_requested_at is not None
        if claimed is None:
            assert (job.status, job.run.status) == (JobStatus.ABORTED, RunStatus.ABORTED)
        else:
            assert job.status == JobStatus.RUNNING and services.job_heartbeat(job_id=job.pk) is False


def test_finish_and_reaper_end_a_job_once(postgres, project, creator):
    version = CodeVersionFactory(code__project=project, code__created_by=creator)
    cpu = Queue.objects.get_or_create(name="cpu")[0]
    for _ in range(6):
        job = services.job_launch(
            actor=creator, code_version=version, queue=cpu, parameters={}, dataset_version_ids=[], max_retries=1
        )
        services.job_claim(job_id=job.pk, worker_host="w")
        Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
        (finished, finish_error), (reaped, reap_error) = together(
            (services.job_finish, {"job_id": job.pk, "exit_code": 1}),
            (services.job_reap_stale, {}),
        )
        assert finish_error is None and reap_error is None
        job.refresh_from_db()
        assert job.status == JobStatus.FAILED and job.run.status == RunStatus.FAILED
        assert Job.objects.filter(retry_of=job).count() == 1, "one retry whoever ended it"


def test_an_abort_and_the_code_finishing_the_run_of_a_jobset_job_end_it_once_without_a_deadlock(
    postgres, project, creator, monkeypatch
):
    """job_abort ends the queued Job then its Run; the pods' finish holds the Run and then ends the Job
    (job_end_with_run). Both lock the Run first, so one waits for the other instead of deadlocking."""
    import jobs.services.lifecycle as lifecycle
    import runs.services as run_services

    version = CodeVersionFactory(code__project=project, code__created_by=creator)
    job = services.job_launch(
        actor=creator,
        code_version=version,
        queue=Queue.objects.get_or_create(name="cpu")[0],
        parameters={},
        dataset_version_ids=[],
    )
    Run.objects.filter(pk=job.run_id).update(status=RunStatus.RUNNING)  # the JobSet's pods attached it
    abort_holds, finish_holds = threading.Event(), threading.Event()
    end_run, effects = lifecycle.end_run, run_services.run_ended_effects

    def slow_end_run(**kwargs):  # the abort has locked what it locks before it ends the Run
        abort_holds.set()
        finish_holds.wait(3)
        return end_run(**kwargs)

    def signalling_effects(**kwargs):  # the finish holds the Run row here, before job_end_with_run
        finish_holds.set()
        return effects(**kwargs)

    monkeypatch.setattr(lifecycle, "end_run", slow_end_run)
    monkeypatch.setattr(run_services, "run_ended_effects", signalling_effects)

    def finish():
        abort_holds.wait(3)
        return run_services.run_set_status(actor=creator, run=Run.objects.get(pk=job.run_id), status="finished")

    outcomes = together((services.job_abort, {"actor": creator, "job": job}), (finish, {}))
    assert [
        type(error).__name__ for _, error in outcomes if error is not None and not isinstance(error, Conflict)
    ] == []
    ended = Job.objects.get(pk=job.pk)
    assert ended.status in (JobStatus.ABORTED, JobStatus.SUCCEEDED) and ended.ended_at is not None
    assert Run.objects.get(pk=job.run_id).status in (RunStatus.ABORTED, RunStatus.FINISHED)
