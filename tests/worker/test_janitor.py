"""Work directories a killed worker left behind are removed when a worker starts (docs/design/worker.md#subprocess;
worker/janitor.py)."""

from jobs.services import job_claim, job_finish
from worker.execute import job_workdir
from worker.janitor import remove_ended_workdirs


def leftover(job_id: int):
    path = job_workdir(job_id)
    (path / "code").mkdir(parents=True)
    (path / "code" / "model.pt").write_bytes(b"weights")
    (path / "code" / "model.pt").chmod(0o444)
    path.joinpath("code").chmod(0o555)  # read-only folders are removed too
    return path


def test_only_the_folders_of_ended_jobs_go(launch, worker_settings):
    ended, running, queued = launch(), launch(), launch()
    job_claim(job_id=ended.pk, worker_host="killed-worker")
    job_finish(job_id=ended.pk, exit_code=None, error="Worker lost")
    job_claim(job_id=running.pk, worker_host="other-worker")
    paths = {job.pk: leftover(job.pk) for job in (ended, running, queued)}
    gone = leftover(987654)  # its Job no longer exists
    other = worker_settings.MADO_WORKER_WORKDIR / "notes"
    other.mkdir()

    assert remove_ended_workdirs() == 2
    assert not paths[ended.pk].exists() and not gone.exists()
    assert paths[running.pk].exists() and paths[queued.pk].exists() and other.exists()
    assert remove_ended_workdirs() == 0


def test_a_missing_workdir_is_fine(db, worker_settings):
    assert not worker_settings.MADO_WORKER_WORKDIR.exists()
    assert remove_ended_workdirs() == 0
