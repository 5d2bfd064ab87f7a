"""Worker test fixtures: a tiny real training program registered as a Code version archive, the ``cpu``
Queue, and worker settings pointing into the test's own directory."""

import io
import json
import sys

import pytest

from checkpoints.services import code_version_create_with_archive
from jobs.models import Queue
from jobs.services import job_claim, job_finish, job_launch
from tests.factories import CodeFactory
from tests.worker.helpers import code_archive


@pytest.fixture(autouse=True)
def worker_settings(settings, tmp_path):
    settings.MADO_WORKER_WORKDIR = tmp_path / "jobs"
    settings.MADO_JOB_KILL_GRACE = 2
    settings.MADO_PUBLIC_URL = "http://mado.test:8000/"
    settings.MADO_WORKER_GPUS = "none"
    return settings


@pytest.fixture
def control(tmp_path):
    """``control(**options)`` writes the code's control file; returns the marker path the code writes."""
    path, marker = tmp_path / "control.json", tmp_path / "marker.json"

    def write(**options):
        path.write_text(json.dumps({"marker": str(marker), **options}))
        return marker

    write()
    return write


@pytest.fixture
def queue(db):
    return Queue.objects.get_or_create(name="cpu", defaults={"runner": "subprocess"})[0]


@pytest.fixture
def make_code_version(project, creator, tmp_path):
    def make(archive: bytes | None = None, entrypoint: list[str] | None = None):
        code = CodeFactory(
            project=project, created_by=creator, name=f"trainer-{CodeFactory._meta.model.objects.count()}"
        )
        archive = code_archive() if archive is None else archive
        return code_version_create_with_archive(
            actor=creator,
            code=code,
            entrypoint=entrypoint or [sys.executable, "train.py", str(tmp_path / "control.json")],
            archive=io.BytesIO(archive),
            archive_name="code.tar.gz",
        )

    return make


@pytest.fixture
def code_version(make_code_version):
    return make_code_version()


@pytest.fixture
def launch(creator, queue, code_version):
    def make(**overrides):
        arguments = dict(
            actor=creator,
            code_version=code_version,
            queue=queue,
            parameters={"lr": 0.1},
            dataset_version_ids=[],
            name="trainer",
        )
        arguments.update(overrides)
        return job_launch(**arguments)

    return make


@pytest.fixture
def failed_source_job(launch):
    """A Job whose code ran and failed (exit 1): the source of a resume."""
    job = launch()
    job_claim(job_id=job.pk, worker_host="earlier-worker")
    return job_finish(job_id=job.pk, exit_code=1)
