"""Fixtures for the jobs tests: Celery calls recorded (never sent), a Code version, Jobs in given states, checkpoints.

``celery_calls`` is autouse: every ``send_task`` and ``revoke`` is recorded
in ``celery_calls.sent`` / ``celery_calls.revoked`` instead of reaching a
broker. On-commit callbacks only run inside
``django_capture_on_commit_callbacks(execute=True)``.
"""

from types import SimpleNamespace

import pytest
from celery import current_app

from checkpoints.models import Checkpoint, CheckpointState
from jobs import services
from jobs.models import Job, Queue
from tests.factories import CodeVersionFactory, DatasetFactory, DatasetVersionFactory


@pytest.fixture(autouse=True)
def celery_calls(monkeypatch):
    calls = SimpleNamespace(sent=[], revoked=[])

    def send_task(name, args=None, kwargs=None, **options):
        calls.sent.append({"name": name, "args": args, **options})
        return SimpleNamespace(id=options.get("task_id"))

    monkeypatch.setattr(current_app, "send_task", send_task)
    monkeypatch.setattr(current_app.control, "revoke", lambda task_id, **kw: calls.revoked.append(task_id))
    return calls


@pytest.fixture
def cpu(db):
    """The queue the data migration creates (re-created after a transactional test's flush removed it)."""
    return Queue.objects.get_or_create(name="cpu")[0]


@pytest.fixture
def gpu(db):
    return Queue.objects.create(name="gpu-a100", description="A100 pool")


@pytest.fixture
def code_version(project, creator):
    return CodeVersionFactory(code__project=project, code__created_by=creator, code__name="trainer", version=1)


@pytest.fixture
def dataset_versions(project):
    dataset = DatasetFactory(project=project, name="digits")
    return [DatasetVersionFactory(dataset=dataset, version="v1"), DatasetVersionFactory(dataset=dataset, version="v2")]


def launch(actor, code_version, queue, **fields) -> Job:
    values = {"parameters": {"lr": 0.1}, "dataset_version_ids": [], "name": "baseline", **fields}
    return services.job_launch(actor=actor, code_version=code_version, queue=queue, **values)


def run_to_end(job: Job, *, exit_code: int | None = 1, aborted: bool = False, error: str = "") -> Job:
    """Claim ``job`` as a worker would and finish it with ``exit_code``."""
    assert services.job_claim(job_id=job.pk, worker_host="gpu-1") is not None
    return services.job_finish(job_id=job.pk, exit_code=exit_code, aborted=aborted, error=error)


def checkpoint(run, step: int, state=CheckpointState.COMPLETE) -> Checkpoint:
    return Checkpoint.objects.create(run=run, step=step, state=state, file_count=1, total_bytes=10)


@pytest.fixture
def failed_job(creator, code_version, cpu, dataset_versions) -> Job:
    """A training Job launched by ``creator`` that failed (exit code 1): Run ``failed``."""
    job = launch(creator, code_version, cpu, dataset_version_ids=[v.pk for v in dataset_versions])
    return run_to_end(job, exit_code=1)


def body(response) -> str:
    return response.content.decode()
