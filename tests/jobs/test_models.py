"""Database invariants of Queues, Jobs, Run logs and Run tokens."""

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs.models import Job, JobKind, JobStatus, Queue, RunLogChunk, RunToken
from tests.factories import RunFactory
from tests.jobs.conftest import launch, run_to_end


def refused(**values) -> bool:
    try:
        with transaction.atomic():
            Job.objects.create(**values)
    except IntegrityError:
        return True
    return False


@pytest.fixture
def job_values(project, creator, code_version, cpu):
    def make(**overrides):
        values = {
            "run": RunFactory(project=project, created_by=creator),
            "code_version": code_version,
            "queue": cpu,
            "created_by": creator,
        }
        return {**values, **overrides}

    return make


def test_the_migration_creates_the_cpu_queue(db):
    cpu = Queue.objects.get(name="cpu")
    assert (cpu.runner, cpu.enabled, cpu.image) == ("subprocess", True, "")


def test_a_container_queue_needs_an_image(db):
    with pytest.raises(IntegrityError), transaction.atomic():
        Queue.objects.create(name="docker", runner="container")
    assert Queue.objects.create(name="docker", runner="container", image="pytorch/pytorch:2").pk


def test_status_kind_attempt_and_lineage_are_checked(job_values, failed_job):
    assert refused(**job_values(status="sleeping"))
    assert refused(**job_values(kind="clone"))
    assert refused(**job_values(attempt=0))
    assert refused(**job_values(kind=JobKind.RESUME)), "a resume names its source Run"
    assert refused(**job_values(kind=JobKind.NEW, resumed_from=failed_job.run))
    assert refused(**job_values(kind=JobKind.RETRY)), "a retry names the Job it retries"
    assert refused(**job_values(retry_of=failed_job))
    assert refused(**job_values(status=JobStatus.FAILED)), "a final Job has ended_at"
    assert not refused(**job_values(status=JobStatus.FAILED, ended_at=timezone.now()))


def test_process_and_node_counts_default_to_one_and_are_positive(job_values):
    assert refused(**job_values(nproc_per_node=0))
    assert refused(**job_values(nnodes=0))
    job = Job.objects.create(**job_values())
    assert (job.nproc_per_node, job.nnodes) == (1, 1)


def test_one_job_per_run(job_values, failed_job):
    assert refused(**job_values(run=failed_job.run))


def test_one_retry_per_job(job_values, failed_job):
    assert not refused(**job_values(kind=JobKind.RETRY, retry_of=failed_job, attempt=2))
    assert refused(**job_values(kind=JobKind.RETRY, retry_of=failed_job, attempt=2))


def test_one_active_resume_per_source_run_but_continues_are_free(job_values, failed_job):
    source = failed_job.run
    assert not refused(**job_values(kind=JobKind.RESUME, resumed_from=source))
    assert refused(**job_values(kind=JobKind.RESUME, resumed_from=source))
    assert not refused(**job_values(kind=JobKind.CONTINUE, resumed_from=source))
    assert not refused(**job_values(kind=JobKind.CONTINUE, resumed_from=source))
    Job.objects.filter(kind=JobKind.RESUME).update(status=JobStatus.FAILED, ended_at=timezone.now())
    assert not refused(**job_values(kind=JobKind.RESUME, resumed_from=source))


def test_log_seq_is_unique_per_run(run):
    RunLogChunk.objects.create(run=run, seq=1, text="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        RunLogChunk.objects.create(run=run, seq=1, text="b")


def test_one_active_token_per_run(run, creator):
    first = RunToken.objects.create(run=run, user=creator, prefix="a", digest="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        RunToken.objects.create(run=run, user=creator, prefix="b", digest="b")
    first.revoked_at = timezone.now()
    first.save()
    second = RunToken.objects.create(run=run, user=creator, prefix="c", digest="c")
    assert RunToken.objects.filter(run=run, revoked_at__isnull=True).get() == second


def test_duration_and_flags(creator, code_version, cpu):
    job = run_to_end(launch(creator, code_version, cpu), exit_code=0)
    assert job.is_final and not job.is_resumed and job.duration_seconds >= 0
