"""``run_job`` runs a tiny real training program (a Code version archive) as the Job's code, in process:
claim → fetch code → (resume: fetch, verify, extract the checkpoint) → run → finish (docs/design/worker.md)."""

import json
import os
import stat

import pytest

from checkpoints import storage
from checkpoints.models import Checkpoint, CheckpointState, ManifestEntry
from jobs import services as jobs_services
from jobs.models import Job, JobKind, JobStatus, RunLogChunk, RunToken
from jobs.services import job_abort, run_resume_from_checkpoint
from mado.tokens import key_digest
from runs.models import Run, RunStatus
from tests.worker.helpers import FILES, make_tar, member, stored_checkpoint, tar_gz
from worker.tasks import run_job

pytestmark = pytest.mark.django_db


def log_of(job) -> str:
    return "".join(RunLogChunk.objects.filter(run_id=job.run_id).order_by("seq").values_list("text", flat=True))


def workdir_is_gone(settings, job) -> bool:
    return not (settings.MADO_WORKER_WORKDIR / f"job-{job.pk}").exists()


def test_a_new_job_runs_the_code_and_succeeds(launch, control, settings, monkeypatch):
    monkeypatch.setenv("MADO_SECRET_KEY", "server-secret")
    monkeypatch.setenv("MADO_DATABASE_URL", "postgresql://u:pw@db/mado")
    marker = control(lines=3)
    job = launch()
    assert run_job(job.pk) == JobStatus.SUCCEEDED
    job.refresh_from_db()
    assert (job.status, job.exit_code, job.error) == (JobStatus.SUCCEEDED, 0, "")
    assert job.run.status == RunStatus.FINISHED and job.worker_host
    seen = json.loads(marker.read_text())
    env = seen["env"]
    token = RunToken.objects.get(run=job.run)
    assert env["MMT_API_URL"] == "http://mado.test:8000" and key_digest(env["MMT_API_TOKEN"]) == token.digest
    assert env["MMT_PROJECT"] == "vision" and env["MMT_RUN_ID"] == job.run.external_id
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["PYTHONUNBUFFERED"] == "1"
    assert not any(name.startswith("MMT_RESUME") for name in env)
    assert "MADO_SECRET_KEY" not in env and "MADO_DATABASE_URL" not in env
    assert "server-secret" not in json.dumps(env) and "pw@db" not in json.dumps(env)
    assert token.revoked_at is not None  # the token dies with the Job
    assert seen["cwd"].endswith(f"job-{job.pk}/code")
    log = log_of(job)
    assert "training code started\n" in log and "to stderr\n" in log and "line 2\n" in log
    assert "[mado] starting" in log
    assert workdir_is_gone(settings, job)


def test_a_non_zero_exit_fails_the_job_and_its_run(launch, control, settings):
    control(exit=3)
    job = launch()
    assert run_job(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert (job.status, job.exit_code, job.error) == (JobStatus.FAILED, 3, "The code exited with code 3.")
    assert Run.objects.get(pk=job.run_id).status == RunStatus.FAILED
    assert workdir_is_gone(settings, job)


def test_a_failed_job_with_retries_left_is_retried_from_scratch(launch, control):
    control(exit=1)
    job = launch(max_retries=1)
    run_job(job.pk)
    retry = Job.objects.get(retry_of=job)
    assert retry.kind == JobKind.RETRY and retry.status == JobStatus.QUEUED
    assert retry.run.source_checkpoint_id is None  # docs/design/resume.md#retry: never from a checkpoint


def test_a_job_that_is_not_queued_is_never_run_twice(launch, control):
    marker = control()
    job = launch()
    assert run_job(job.pk) == JobStatus.SUCCEEDED
    marker.unlink()
    assert run_job(job.pk) == "skipped"  # a redelivered message
    assert not marker.exists()
    assert run_job(987654) == "skipped"  # gone


def test_a_job_aborted_before_it_started_never_runs(launch, control, creator):
    marker = control()
    job = launch()
    job_abort(actor=creator, job=job)
    assert run_job(job.pk) == "skipped"
    assert not marker.exists()
    assert Job.objects.get(pk=job.pk).status == JobStatus.ABORTED


def abort_when_logged(monkeypatch, job, actor, text="ready"):
    """A user aborts the Job as soon as ``text`` shows in its log (what the Job page does, same thread)."""
    real = jobs_services.job_append_log

    def append(*, job_id, **kwargs):
        chunk = real(job_id=job_id, **kwargs)
        if text in kwargs["text"]:
            job_abort(actor=actor, job=Job.objects.get(pk=job_id))
        return chunk

    monkeypatch.setattr(jobs_services, "job_append_log", append)


def test_abort_sends_sigterm_and_the_job_and_run_end_aborted(launch, control, creator, monkeypatch):
    control(wait=True)
    job = launch()
    abort_when_logged(monkeypatch, job, creator)
    assert run_job(job.pk) == JobStatus.ABORTED
    job.refresh_from_db()
    assert job.exit_code == 143 and job.run.status == RunStatus.ABORTED
    assert "SIGTERM received, saving and exiting" in log_of(job)


def test_code_that_ignores_sigterm_is_killed_after_the_grace_period(launch, control, creator, monkeypatch, settings):
    settings.MADO_JOB_KILL_GRACE = 1
    control(wait=True, ignore_term=True)
    job = launch()
    abort_when_logged(monkeypatch, job, creator)
    assert run_job(job.pk) == JobStatus.ABORTED
    job.refresh_from_db()
    assert job.exit_code == -9 and job.run.status == RunStatus.ABORTED


def test_an_unsafe_code_archive_fails_the_job_before_anything_runs(make_code_version, launch, control):
    marker = control()
    version = make_code_version(archive=tar_gz([("train.py", b"x"), ("evil", b"", b"2", "/etc/passwd")]))
    job = launch(code_version=version)
    assert run_job(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert job.error.startswith(f"Code version {version.pk} archive rejected") and "symbolic link" in job.error
    assert job.exit_code is None and not marker.exists()


def test_a_missing_program_fails_the_job_with_a_clear_error(make_code_version, launch, control):
    job = launch(code_version=make_code_version(entrypoint=["no-such-trainer-program", "train.py"]))
    assert run_job(job.pk) == JobStatus.FAILED
    assert "The code could not be started: 'no-such-trainer-program'" in Job.objects.get(pk=job.pk).error


def test_an_unreadable_storage_fails_the_job_instead_of_leaving_it_running(launch, control, monkeypatch):
    marker = control()
    job = launch()

    def broken(**kwargs):
        raise ConnectionError("storage unreachable")

    monkeypatch.setattr(storage, "blob_open_range", broken)
    monkeypatch.setattr("worker.fetch.time.sleep", lambda seconds: None)
    assert run_job(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert "Worker error" in job.error and "storage unreachable" in job.error and not marker.exists()


# --- resume (docs/design/worker.md) --------------------------------------------------------------------


def snapshot(source_run):
    """The source Run, its checkpoints and their manifests as stored rows (docs/design/resume.md#lineage: never
    modified)."""
    return (
        Run.objects.filter(pk=source_run.pk).values().get(),
        list(Checkpoint.objects.filter(run=source_run).order_by("pk").values()),
        list(ManifestEntry.objects.filter(checkpoint__run=source_run).order_by("pk").values()),
    )


def resume_job(failed_source_job, creator, **checkpoint_options):
    checkpoint = stored_checkpoint(failed_source_job.run, 20, **checkpoint_options)
    return run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint), checkpoint


def test_a_resumed_job_gets_the_verified_checkpoint_read_only(failed_source_job, creator, control, settings):
    marker = control()
    job, checkpoint = resume_job(failed_source_job, creator)
    before = snapshot(failed_source_job.run)
    assert run_job(job.pk) == JobStatus.SUCCEEDED
    seen = json.loads(marker.read_text())
    env = seen["env"]
    workdir = settings.MADO_WORKER_WORKDIR / f"job-{job.pk}"
    assert env["MMT_RESUME_CHECKPOINT_DIR"] == str(workdir / "checkpoint")
    assert env["MMT_RESUME_STEP"] == "20"
    assert env["MMT_RESUME_CHECKPOINT_FILE"] == str(workdir / "resume-checkpoint.json")
    assert {path: data.encode("latin-1") for path, data in seen["files"].items()} == FILES
    assert seen["modes"] == {
        ".": "0o555",
        "optim": "0o555",
        "model.pt": "0o444",
        "empty.bin": "0o444",
        "optim/state.pt": "0o444",
    }
    info = seen["resume_file"]
    assert (info["checkpointId"], info["sourceRunId"], info["step"]) == (checkpoint.pk, failed_source_job.run_id, 20)
    assert len(info["manifestSha256"]) == 64 and info["includesOptimizer"] is True
    assert f"[mado] checkpoint {checkpoint.pk} (step 20): 3 files" in log_of(job)
    assert snapshot(failed_source_job.run) == before
    assert workdir_is_gone(settings, job)


TAMPERING = {
    "extra file": (dict(stored=make_tar({**FILES, "extra.bin": b"x"})), "manifest", "extra file 'extra.bin'"),
    "changed byte": (
        dict(stored=make_tar({**FILES, "model.pt": b"X" + FILES["model.pt"][1:]})),
        "sha256",
        "'model.pt' has SHA-256",
    ),
    "symlink": (
        dict(stored=make_tar(FILES, extra=[member("ln", kind=b"2", linkname="/etc/passwd")])),
        "tar",
        "'ln' is a symbolic link",
    ),
    "dot-dot": (dict(stored=make_tar(FILES, extra=[member("../escape", b"x")])), "path", "'../escape'"),
    "truncated": (dict(stored=make_tar(FILES)[:5000]), "tar", "truncated"),
}


@pytest.mark.parametrize("kind", list(TAMPERING))
def test_a_tampered_checkpoint_fails_the_job_and_the_code_never_starts(
    failed_source_job, creator, control, settings, kind
):
    options, what, detail = TAMPERING[kind]
    marker = control()
    job, checkpoint = resume_job(failed_source_job, creator, **options)
    before = snapshot(failed_source_job.run)
    assert run_job(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert job.error.startswith(f"Checkpoint {checkpoint.pk} {what} mismatch: "), job.error
    assert detail in job.error and job.exit_code is None
    assert not marker.exists(), "the code started although the checkpoint did not verify"
    assert not RunToken.objects.filter(run=job.run).exists()
    assert job.run.status == RunStatus.FAILED
    assert job.error in log_of(job)
    checkpoint.refresh_from_db()  # its stored bytes differ from what was verified: it is named corrupt, nothing else
    assert checkpoint.state == CheckpointState.CORRUPT and checkpoint.error.startswith("the tar: the stored object")
    run_row, checkpoints, manifest = before
    checkpoints[-1].update(state=CheckpointState.CORRUPT, error=checkpoint.error)
    assert snapshot(failed_source_job.run) == (run_row, checkpoints, manifest)
    assert workdir_is_gone(settings, job)
    assert not list((settings.MADO_WORKER_WORKDIR).glob("**/escape"))


def test_a_missing_checkpoint_object_fails_the_job(failed_source_job, creator, control):
    marker = control()
    job, checkpoint = resume_job(failed_source_job, creator)
    storage.artifact_storage().delete(checkpoint.artifact.storage_key)
    assert run_job(job.pk) == JobStatus.FAILED
    assert Job.objects.get(pk=job.pk).error.startswith(f"Checkpoint {checkpoint.pk} artifact mismatch: object missing")
    assert not marker.exists()


def test_a_job_whose_checkpoint_cannot_be_read_says_why_in_its_log_too(
    failed_source_job, creator, control, monkeypatch
):
    marker = control()
    job, _ = resume_job(failed_source_job, creator)

    def broken(**kwargs):
        raise ConnectionError("storage unreachable")

    monkeypatch.setattr(storage, "blob_open_range", broken)
    monkeypatch.setattr("worker.fetch.time.sleep", lambda seconds: None)
    assert run_job(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert "storage unreachable" in job.error and "storage unreachable" in log_of(job)
    assert not marker.exists()


def test_a_broken_download_is_resumed_and_the_job_succeeds(failed_source_job, creator, control, monkeypatch):
    big = {"model.pt": os.urandom(2 * 1024 * 1024 + 17), "rng.bin": b"r"}
    marker = control()
    job, checkpoint = resume_job(failed_source_job, creator, files=big)
    real, starts = storage.blob_open_range, []

    def flaky(*, key, start, length, chunk_size):
        starts.append((key, start))
        inner = real(key=key, start=start, length=length, chunk_size=chunk_size)
        if key != checkpoint.artifact.storage_key or len([s for s in starts if s[0] == key]) > 1:
            return inner

        def broken():
            yield next(inner)
            inner.close()
            raise ConnectionResetError("reset")

        return broken()

    monkeypatch.setattr(storage, "blob_open_range", flaky)
    monkeypatch.setattr("worker.fetch.time.sleep", lambda seconds: None)
    assert run_job(job.pk) == JobStatus.SUCCEEDED
    assert [s for k, s in starts if k == checkpoint.artifact.storage_key] == [0, 1024 * 1024]
    assert json.loads(marker.read_text())["files"]["model.pt"].encode("latin-1") == big["model.pt"]


def test_an_abort_during_the_download_stops_it_and_the_code_never_starts(
    failed_source_job, creator, control, monkeypatch
):
    big = {"model.pt": os.urandom(3 * 1024 * 1024)}
    marker = control()
    job, checkpoint = resume_job(failed_source_job, creator, files=big)
    real = storage.blob_open_range

    def abort_then_read(**kwargs):
        if kwargs["key"] == checkpoint.artifact.storage_key:
            job_abort(actor=creator, job=Job.objects.get(pk=job.pk))
        return real(**kwargs)

    monkeypatch.setattr(storage, "blob_open_range", abort_then_read)
    assert run_job(job.pk) == JobStatus.ABORTED
    job.refresh_from_db()
    assert job.error == "Aborted before the code started." and not marker.exists()
    assert job.run.status == RunStatus.ABORTED


def test_extraction_never_leaves_a_checkpoint_directory_behind(failed_source_job, creator, control, settings):
    control()
    job, _ = resume_job(
        failed_source_job, creator, stored=make_tar({**FILES, "model.pt": b"Y" * len(FILES["model.pt"])})
    )
    run_job(job.pk)
    assert not any(settings.MADO_WORKER_WORKDIR.rglob("checkpoint*"))
    assert not any(p for p in settings.MADO_WORKER_WORKDIR.rglob("*") if stat.S_ISDIR(p.lstat().st_mode))


@pytest.mark.django_db(transaction=True)  # the task closes the failed connection and opens a new one
def test_a_database_error_before_the_claim_retries_the_task(launch, control, monkeypatch):
    from django.db import OperationalError

    marker = control()
    job = launch()
    real, calls = jobs_services.job_claim, []

    def flaky_claim(**kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            raise OperationalError("database is locked")
        return real(**kwargs)

    monkeypatch.setattr(jobs_services, "job_claim", flaky_claim)
    result = run_job.apply(args=[job.pk])
    assert result.get() == JobStatus.SUCCEEDED and len(calls) == 2 and marker.exists()


def test_the_task_is_configured_for_long_jobs():
    # a message whose worker was killed goes back to the queue; job_claim lets only one delivery run the code
    assert run_job.acks_late is True and run_job.reject_on_worker_lost is True
    assert run_job.max_retries == 5 and run_job.name == "worker.tasks.run_job"


@pytest.mark.django_db(transaction=True)  # the task closes the failed connection and opens a new one
def test_database_hiccups_while_the_code_runs_do_not_kill_it(launch, control, monkeypatch):
    from django.db import OperationalError

    control(lines=2)
    job = launch()
    beats, appends = [], []
    real_beat, real_append = jobs_services.job_heartbeat, jobs_services.job_append_log

    def heartbeat(**kwargs):
        beats.append(1)
        if len(beats) <= 2:
            raise OperationalError("server closed the connection unexpectedly")
        return real_beat(**kwargs)

    def append(**kwargs):
        appends.append(kwargs["text"])
        if "training code started" in kwargs["text"]:
            raise OperationalError("database is locked")
        return real_append(**kwargs)

    monkeypatch.setattr(jobs_services, "job_heartbeat", heartbeat)
    monkeypatch.setattr(jobs_services, "job_append_log", append)
    assert run_job(job.pk) == JobStatus.SUCCEEDED
    assert len(beats) >= 2 and any("training code started" in text for text in appends)
