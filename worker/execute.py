"""Execute one claimed Job: prepare its working directory, run the code, report while it runs (docs/design/worker.md).

``execute(job)`` is what ``worker.tasks.run_job`` calls between ``job_claim``
and ``job_finish``. In order, nothing started before the previous step
succeeded (docs/design/house.md#verify-first):

1. a fresh ``<MADO_WORKER_WORKDIR>/job-<id>``;
2. the Code version's archive: fetched (size + SHA-256), extracted safely into ``code/``;
3. resume / continue only: the Run's source checkpoint downloaded, verified
   and extracted read-only into ``checkpoint/`` in one streaming pass, and
   ``resume-checkpoint.json`` written (``worker.fetch``, ``worker.extract``;
   a checkpoint stored file by file, e.g. from MLflow: ``worker.fetch_files``);
4. the Run's token (``jobs.services.run_token_issue``) and the environment of docs/jobs.md;
5. the code: a subprocess or ``docker run`` (the Queue's runner), its log appended to the Run,
   ``job_heartbeat`` every ``HEARTBEAT_S`` seconds (False → ``MADO_JOB_STOP_SIGNAL``, SIGKILL after
   ``MADO_JOB_KILL_GRACE``; the same when the worker itself is stopped, ``worker.shutdown``, and the Job then
   ends ``preempted``, docs/design/worker.md#stop);
   with ``nproc_per_node`` > 1 under torchrun, every rank reading the one restored checkpoint, each failed
   rank's exit in the Job's error (``worker.distributed``, docs/design/worker.md#distributed).

Heartbeats are sent during the download and extraction too, so a long
download is not taken for a lost worker, and an abort or the worker's stop
ends it. The working directory is removed when the Job ends.
"""

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, close_old_connections

from checkpoints.models import CheckpointLayout
from checkpoints.services.integrity import checkpoint_confirm_damage
from jobs import services as jobs_services
from jobs.models import Job, JobKind, Runner
from runs.stages import data_composition_at
from worker import container, distributed, shutdown
from worker.errors import CheckpointMismatch, PrepareError
from worker.extract import extract_code_archive, remove_tree, write_resume_info
from worker.fetch import fetch_artifact, restore_checkpoint
from worker.fetch_files import restore_checkpoint_files
from worker.runner import child_env, run_process

HEARTBEAT_S = 2.0  # seconds between job_heartbeat calls (well within MADO_JOB_HEARTBEAT_TIMEOUT)
RESUMING_KINDS = frozenset({JobKind.RESUME, JobKind.CONTINUE})
START_KINDS = {JobKind.CONTINUE: "continue", JobKind.RESUME: "resume"}  # MMT_START_KIND; else "new"
LOG_PREFIX = "[mado] "

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """What ``job_finish`` is told: the code's ``exit_code`` (None: it never ran), an ``error``, ``aborted``,
    ``preempted`` (the worker was stopped and stopped the code, docs/design/worker.md#stop)."""

    exit_code: int | None
    error: str = ""
    aborted: bool = False
    preempted: bool = False


@dataclass(frozen=True)
class Prepared:
    code_dir: Path
    checkpoint_dir: Path | None = None
    resume_file: Path | None = None
    step: int | None = None


class _StopRequested(Exception):
    """``job_heartbeat`` said stop while the Job was being prepared."""


class _Heartbeat:
    """Calls ``job_heartbeat`` at most every ``HEARTBEAT_S`` seconds; remembers a "stop" answer and whether the
    worker's own stop came first (``worker_stop``: the signal that stopped the worker)."""

    def __init__(self, job_id: int):
        self.job_id = job_id
        self.stop = False
        self.worker_stop: signal.Signals | None = None
        self._last = 0.0

    def __call__(self, *, force: bool = False) -> bool:
        """True when the code must stop (the worker is stopping, an abort was requested, or the Job is no longer
        running). Beats on while the worker stops, so the Job stays alive while its code saves."""
        if self.worker_stop is None and not self.stop:
            self.worker_stop = shutdown.stop_signal()
        now = time.monotonic()
        if not self.stop and (force or now - self._last >= HEARTBEAT_S):
            self._last = now
            try:
                self.stop = not jobs_services.job_heartbeat(job_id=self.job_id)
            except DatabaseError:  # a database hiccup must not kill hours of training; the reaper decides
                logger.warning("job %s: heartbeat failed; the code keeps running", self.job_id, exc_info=True)
                close_old_connections()
        return self.stop or self.worker_stop is not None

    def stopped_before_start(self) -> Outcome:
        """The outcome of a Job stopped before its code started."""
        if self.worker_stop is not None:
            return Outcome(exit_code=None, error=shutdown.stopped_reason(self.worker_stop), preempted=True)
        return Outcome(exit_code=None, error="Aborted before the code started.", aborted=True)

    def during_prepare(self) -> None:
        if self():
            raise _StopRequested


def job_workdir(job_id: int) -> Path:
    return Path(settings.MADO_WORKER_WORKDIR) / f"job-{job_id}"


def execute(job: Job) -> Outcome:
    """Run claimed ``job`` (status running; loaded by ``job_claim``) to its outcome; never raises for the code's
    or the data's faults (docs/design/worker.md#refusal, #subprocess).

    A verification failure or an unusable Code archive → ``Outcome(None,
    "<message>")`` and the code never starts; an abort → ``aborted=True``.
    Raises ``StorageUnavailable`` (storage unreadable after retries) and
    unexpected errors, which the task turns into a failed Job.
    """
    workdir = job_workdir(job.pk)
    remove_tree(workdir)  # a redelivered message may find an earlier attempt's leftovers
    workdir.mkdir(parents=True)
    heartbeat = _Heartbeat(job.pk)
    try:
        try:
            prepared = prepare(job, workdir, heartbeat.during_prepare)
        except PrepareError as exc:
            _log(job, str(exc))
            return Outcome(exit_code=None, error=str(exc))
        except _StopRequested:
            return heartbeat.stopped_before_start()
        except Exception as exc:
            _log(job, f"the Job could not be prepared: {exc}")  # the log says why, not only the error field
            raise
        if heartbeat(force=True):
            return heartbeat.stopped_before_start()
        return run_code(job, prepared, heartbeat)
    finally:
        _remove_quietly(workdir)


def prepare(job: Job, workdir: Path, on_progress: Callable[[], None]) -> Prepared:
    """Steps 2 and 3 of the module docstring; ``PrepareError`` when the Job cannot start."""
    code_version = job.code_version
    if code_version.archive_id is None:
        code_dir = workdir / "code"
        code_dir.mkdir()
    else:
        label = f"Code version {code_version.pk} archive"
        archive = workdir / "code.archive"
        fetch_artifact(artifact=code_version.archive, dest=archive, label=label, on_progress=on_progress)
        code_dir = extract_code_archive(archive_path=archive, workdir=workdir, label=label)
        archive.unlink()
    if job.kind not in RESUMING_KINDS:
        return Prepared(code_dir=code_dir)
    checkpoint = job.run.source_checkpoint
    if checkpoint is None:
        raise PrepareError(f"Job {job.pk} is a {job.kind} but its Run records no source checkpoint")
    # A checkpoint stored as one artifact per file (MLflow, docs/design/checkpoints.md#mlflow-checkpoints): the same
    # checks, the same directory.
    restore = restore_checkpoint_files if checkpoint.layout == CheckpointLayout.FILES else restore_checkpoint
    started = time.monotonic()
    try:
        restored = restore(checkpoint=checkpoint, workdir=workdir, on_progress=on_progress)
    except CheckpointMismatch:  # the stored bytes read back: corrupt when they do differ (checkpoints.md#damage)
        checkpoint_confirm_damage(checkpoint)
        raise
    resume_file = write_resume_info(workdir=workdir, checkpoint=checkpoint, manifest=restored.manifest)
    _log(
        job,
        (
            f"checkpoint {checkpoint.pk} (step {checkpoint.step}): "
            f"{len(restored.manifest)} files, {restored.size} bytes "
            f"downloaded, verified and extracted in {time.monotonic() - started:.2f} s "
            f"({restored.bytes_written} bytes written)"
            + (f", once, read-only, for all {job.nproc_per_node} ranks" if job.nproc_per_node > 1 else "")
        ),
    )
    return Prepared(
        code_dir=code_dir, checkpoint_dir=restored.checkpoint_dir, resume_file=resume_file, step=checkpoint.step
    )


def code_variables(job: Job, prepared: Prepared, token: str) -> dict[str, str]:
    """The ``MMT_*`` variables and GPU assignment of docs/jobs.md for the code of ``job``.

    ``MMT_START_KIND`` is ``continue``, ``resume`` or ``new`` (a retry starts
    from scratch) and ``MMT_DATASET_VERSION_IDS`` the comma-separated dataset
    versions in force at the step the code starts at (docs/design/runs.md#data-stages; docs/design/resume.md#continue):
    a continue with another data mix gets the new set, so the code can reset its data position.
    """
    run = job.run
    start_step = prepared.step if prepared.checkpoint_dir is not None else 0
    variables = {
        "MMT_API_URL": settings.MADO_PUBLIC_URL.rstrip("/"),
        "MMT_API_TOKEN": token,
        "MMT_PROJECT": run.project.slug,
        "MMT_RUN_ID": run.external_id,
        "MMT_START_KIND": START_KINDS.get(job.kind, "new"),
        "MMT_DATASET_VERSION_IDS": ",".join(
            str(v.pk) for v in sorted(data_composition_at(run=run, step=start_step), key=lambda v: v.pk)
        ),
    }
    if prepared.checkpoint_dir is not None:
        variables.update(
            {
                "MMT_RESUME_CHECKPOINT_DIR": str(prepared.checkpoint_dir),
                "MMT_RESUME_STEP": str(prepared.step),
                "MMT_RESUME_CHECKPOINT_FILE": str(prepared.resume_file),
            }
        )
    devices = container.cuda_visible_devices(settings.MADO_WORKER_GPUS, os.environ)
    if devices is not None:
        variables["CUDA_VISIBLE_DEVICES"] = devices
    return variables


def command(
    job: Job, prepared: Prepared, variables: dict[str, str]
) -> tuple[list[str], dict[str, str], Callable[[], None] | None]:
    """``(argv, env, on_kill)`` for the Queue's runner: the entrypoint itself, or ``docker run`` around it."""
    entrypoint = list(job.code_version.entrypoint)
    if job.nproc_per_node > 1:
        entrypoint = distributed.torchrun_argv(entrypoint, job.nproc_per_node)
    if job.queue.runner != Runner.CONTAINER:
        return entrypoint, child_env(variables), None
    inside = container.container_env(variables)
    env = child_env(inside, passthrough=container.DOCKER_CLIENT_VARIABLES)
    argv = container.docker_run_argv(
        job_id=job.pk,
        image=job.queue.image,
        argv=entrypoint,
        env_names=[*inside, "PYTHONUNBUFFERED"],
        code_dir=prepared.code_dir,
        checkpoint_dir=prepared.checkpoint_dir,
        resume_file=prepared.resume_file,
        gpus=settings.MADO_WORKER_GPUS,
        worker_env=os.environ,
    )

    def remove_container() -> None:
        try:
            subprocess.run(container.docker_kill_argv(job.pk), env=env, capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError):
            logger.warning("could not remove the container of job %s", job.pk, exc_info=True)

    return argv, env, remove_container


def run_code(job: Job, prepared: Prepared, heartbeat: _Heartbeat) -> Outcome:
    """Step 4 and 5: start the code and wait for it; its exit code (or the stop) is the outcome."""
    token = jobs_services.run_token_issue(job=job).key
    argv, env, on_kill = command(job, prepared, code_variables(job, prepared, token))
    _log(job, f"starting {argv!r} in {prepared.code_dir}")
    ranks = distributed.RankExits()

    def on_output(text: str) -> None:
        ranks.feed(text)
        _append_log(job, text)

    try:
        result = run_process(
            argv,
            cwd=prepared.code_dir,
            env=env,
            on_output=on_output,
            should_stop=heartbeat,
            grace_s=settings.MADO_JOB_KILL_GRACE,
            log_max_bytes=settings.MADO_JOB_LOG_MAX_BYTES,
            on_kill=on_kill,
            stop_signal=settings.MADO_JOB_STOP_SIGNAL,
        )
    except OSError as exc:  # the entrypoint's program does not exist or is not executable
        message = f"The code could not be started: {argv[0]!r}: {exc.strerror or exc}"
        _log(job, message)
        return Outcome(exit_code=None, error=message)
    if result.stopped and heartbeat.worker_stop is not None:
        error = shutdown.stopped_reason(
            heartbeat.worker_stop,
            result,
            stop_signal=settings.MADO_JOB_STOP_SIGNAL,
            grace_s=settings.MADO_JOB_KILL_GRACE,
        )
        _log(job, error)
        return Outcome(exit_code=result.exit_code, error=error, preempted=True)
    error = ""
    if job.nproc_per_node > 1 and result.exit_code != 0 and not result.stopped:
        error = ranks.summary(job.nproc_per_node, result.exit_code)
        _log(job, error)
    return Outcome(exit_code=result.exit_code, error=error, aborted=result.stopped)


def _remove_quietly(workdir: Path) -> None:
    """Remove the working directory; what the code left there must not change the Job's outcome."""
    try:
        remove_tree(workdir)
    except OSError:
        logger.warning("could not remove %s", workdir, exc_info=True)


def _append_log(job: Job, text: str) -> None:
    try:
        jobs_services.job_append_log(job_id=job.pk, text=text)
    except DatabaseError:  # losing a piece of log beats killing the code
        logger.warning("job %s: %d characters of log lost", job.pk, len(text), exc_info=True)
        close_old_connections()


def _log(job: Job, line: str) -> None:
    _append_log(job, f"{LOG_PREFIX}{line}\n")
