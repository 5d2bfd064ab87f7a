"""Offline runs (docs/design/runs.md#offline): the same calls as an online Run, recorded in a local directory, no
server.

Layout of an offline run's directory (``mado sync DIR`` uploads it later)::

    run.json              project, name, kind, parameters, external_id, status,
                          created_at / started_at / ended_at, attempts, checkpoints
    metrics.jsonl         one point per line: {"key", "value", "step", "timestamp"}
                          (the API's point format; NaN/±inf as strings), appended
                          and flushed by every log_metrics call
    checkpoints/step-N/   each checkpoint directory, copied as it was saved

``run.json`` is rewritten atomically (temp file + rename). A checkpoint is
copied into a hidden temporary directory first and renamed to ``step-N``, so
a killed program never leaves a half-copied ``step-N`` behind.

A directory that already holds a run is only reused by a run that resumes
from a checkpoint (``MMT_RESUME_*`` set, e.g. from its own
``checkpoints/step-20``): the record continues (a new entry in
``attempts``, metrics appended, new checkpoints added). A fresh run there is
refused, so two unrelated runs never mix their points.
"""

import json
import os
import shutil
import uuid
from concurrent.futures import Future
from datetime import UTC, datetime
from pathlib import Path

from mado_tracking import console
from mado_tracking._base import RunBase, check_finish_status, new_external_id
from mado_tracking.checkpoints import SavedCheckpoint, check_metadata, check_step
from mado_tracking.errors import CheckpointError, MadoError
from mado_tracking.points import point_json
from mado_tracking.resume import resume_checkpoint
from mado_tracking.tarstream import CheckpointTar, scan
from mado_tracking.training_state import with_training_state

ENV_OFFLINE_DIR = "MMT_OFFLINE_DIR"
RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_DIR = "checkpoints"
FORMAT = 1


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def read_record(directory: Path) -> dict:
    """The ``run.json`` of an offline run directory; ``MadoError`` when it is missing or unreadable."""
    path = Path(directory) / RUN_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MadoError(f"{directory}: not an offline mado run (no {RUN_FILE})") from None
    except (OSError, ValueError) as exc:
        raise MadoError(f"{path}: cannot be read ({exc})") from None
    if not isinstance(record, dict) or not record.get("external_id"):
        raise MadoError(f"{path}: not an offline run record (no external_id)")
    return record


def write_json_atomically(path: Path, data: dict) -> None:
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def start_offline_run(
    *,
    project: str | None,
    name: str | None,
    kind: str,
    parameters: dict,
    output: str | os.PathLike | None,
    external_id: str | None = None,
) -> "OfflineRun":
    """Start (or, when resuming, continue) the offline run in ``output`` (docs/design/runs.md#offline); see the module
    docstring.

    ``output`` defaults to ``MMT_OFFLINE_DIR``, else ``./mado-offline/<run id>``;
    ``external_id`` (the run id) defaults to a fresh random one.
    Raises ``MadoError`` when the directory already holds a run and this one
    does not resume from a checkpoint, ``ResumeError`` for inconsistent
    ``MMT_RESUME_*`` variables.
    """
    external_id = external_id or new_external_id()
    chosen = output if output is not None else os.environ.get(ENV_OFFLINE_DIR, "").strip() or None
    directory = Path(chosen) if chosen is not None else Path("mado-offline") / external_id
    resume = resume_checkpoint()
    started = now_iso()
    attempt = {
        "started_at": started,
        "ended_at": None,
        "status": "running",
        "resumed_from": None
        if resume is None
        else {
            "checkpoint_id": resume.id,
            "source_run_id": resume.source_run_id,
            "step": resume.step,
            "path": str(resume.path),
        },
    }
    if (directory / RUN_FILE).exists():
        record = read_record(directory)
        if resume is None:
            raise MadoError(
                f"{directory} already holds offline run {record['external_id']} ({record.get('status')}); "
                "choose another output directory (a run that resumes from a checkpoint may continue it)"
            )
        record["status"], record["ended_at"] = "running", None
        record.setdefault("attempts", []).append(attempt)
    else:
        directory.mkdir(parents=True, exist_ok=True)
        record = {
            "format": FORMAT,
            "external_id": external_id,
            "project": project,
            "name": "" if name is None else str(name),
            "kind": kind,
            "parameters": parameters,
            "status": "running",
            "created_at": started,
            "started_at": started,
            "ended_at": None,
            "attempts": [attempt],
            "checkpoints": [],
        }
    run = OfflineRun(directory=directory, record=record, step=0 if resume is None else resume.step)
    console.announce(
        external_id=run.external_id, resumed=resume is not None, step=run.step, where=str(directory.resolve())
    )
    return run


class OfflineRun(RunBase):
    """An offline Run (docs/design/runs.md#offline): ``log_metrics``, ``log_checkpoint``, ``resume_checkpoint``,
    ``finish``, ``with``, as ``Run``, written to ``directory``.

    Attributes: ``id`` (None: no server id), ``external_id`` (the run id,
    kept by ``mado sync``), ``directory`` (Path), ``url`` (``file://`` URL of
    the directory), ``project``, ``name``, ``kind``, ``parameters``, ``status``,
    ``step`` (next ``log_metrics`` step: 0, or the step of the checkpoint
    resumed from), ``preempting``.
    """

    offline = True

    def __init__(self, *, directory: Path, record: dict, step: int = 0):
        self.id = None
        self.step = step
        self.directory = Path(directory)
        self._record = record
        self.external_id: str = record["external_id"]
        self.project = record.get("project")
        self.name = record.get("name", "")
        self.kind = record.get("kind", "training")
        self.parameters = record.get("parameters") or {}
        self.status = record["status"]
        self.url = self.directory.resolve().as_uri()
        self._finishing = False
        self._save_record()
        self._metrics = open(self.directory / METRICS_FILE, "a", encoding="ascii")
        self._opened()

    def __repr__(self) -> str:
        return f"<OfflineRun {self.external_id} {self.name!r} {self.status} in {self.directory}>"

    def log_training_data_stage(
        self, start_step: int, input_dataset_version_ids, checkpoint_id=None, metadata=None
    ) -> dict:
        """Not available offline (docs/design/runs.md#data-stages-sdk): data stages are recorded on the server only.

        Raises:
            MadoError: always, saying so.
        """
        raise MadoError(
            "log_training_data_stage is online only: data stages are not recorded offline and `mado sync` does not "
            "upload them; run online (unset MMT_MODE=offline / offline=True) to record the stage at step "
            f"{start_step}"
        )

    def _save_record(self) -> None:
        write_json_atomically(self.directory / RUN_FILE, self._record)

    def _require_open(self, what: str) -> None:
        if self._finishing:
            raise MadoError(f"offline run {self.external_id} is finished; {what} must come before finish()")

    def log_metrics(self, metrics, step: int | None = None, *, all_ranks: bool = False) -> None:
        """Append the points to ``metrics.jsonl`` and flush (docs/design/resume.md#steps-continue;
        docs/design/runs.md#offline); ``step``, ``all_ranks`` and validation as ``Run.log_metrics``."""
        self._require_open("log_metrics")
        points = self._encode(metrics, step, all_ranks)
        if points:
            self._metrics.write("\n".join(map(point_json, points)) + "\n")
            self._metrics.flush()

    def log_checkpoint(
        self,
        directory: str | os.PathLike,
        step: int,
        includes_optimizer: bool = False,
        framework: str | None = None,
        *,
        wait: bool = True,
        metadata: dict | None = None,
        state: dict | None = None,
    ) -> SavedCheckpoint | Future:
        """Copy ``directory`` to ``checkpoints/step-<step>/`` (docs/design/checkpoints.md#a-checkpoint;
        docs/design/runs.md#offline); the refusals of ``Run.log_checkpoint``.

        Returns a ``SavedCheckpoint`` with ``id`` None, ``sha256`` of the tar
        ``mado sync`` will upload, and ``location`` the copied directory;
        with ``wait=False`` a ``Future`` already holding it (the same type as
        online: offline the copy is the save, there is nothing to wait for).
        ``metadata`` and ``state``: as ``Run.log_checkpoint`` (the training state
        is kept with the checkpoint, docs/design/checkpoints.md#training-state).
        Raises ``CheckpointError`` naming the path (symbolic link, empty
        directory, non-regular file, negative step, step already saved here).
        """
        self._require_open("log_checkpoint")
        step = check_step(step, directory)
        metadata = check_metadata(with_training_state(directory, metadata, state, step), directory)
        files = scan(directory)
        root = self.directory / CHECKPOINTS_DIR
        target = root / f"step-{step}"
        if target.exists():
            raise CheckpointError(
                f"{directory}: step {step} is already saved in offline run {self.external_id} ({target})", field="step"
            )
        root.mkdir(exist_ok=True)
        partial = root / f".step-{step}.{uuid.uuid4().hex}.partial"
        try:
            for relative, source, _size in files:
                destination = partial / relative
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, destination)
            try:
                partial.rename(target)
            except OSError:
                raise CheckpointError(
                    f"{directory}: step {step} is already saved in offline run {self.external_id} ({target})",
                    field="step",
                ) from None
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        tar = CheckpointTar(target, tar_hash=True)
        for _ in tar:  # the digests of the tar ``mado sync`` will send
            pass
        entry = {
            "step": step,
            "framework": framework or "",
            "includes_optimizer": bool(includes_optimizer),
            "file_count": len(tar.manifest),
            "total_bytes": tar.total_bytes,
            "tar_size": len(tar),
            "tar_sha256": tar.sha256,
            "created_at": now_iso(),
        }
        if metadata:
            entry["metadata"] = metadata
        self._record.setdefault("checkpoints", []).append(entry)
        self._save_record()
        saved = SavedCheckpoint(
            id=None,
            step=step,
            sha256=tar.sha256,
            tar_size=len(tar),
            file_count=len(tar.manifest),
            total_bytes=tar.total_bytes,
            location=str(target),
        )
        if wait:
            return saved
        done: Future = Future()
        done.set_result(saved)
        return done

    def mark_preempting(self) -> None:
        """Record ``preempting`` in ``run.json`` (docs/design/sweeps.md#sweeps), as ``Run.mark_preempting``: sticky,
        idempotent, safe in a signal handler; the run then ends ``preempted`` unless the program exits cleanly."""
        if self.preempting or self._finishing:
            return
        self.preempting = True
        self._set_status("preempting", ended=None)

    def finish(self, status: str = "finished", *, timeout: float | None = None) -> None:
        """Record the final status and end time in ``run.json``; calling it again does nothing.

        ``status``: ``"finished"``, ``"failed"``, ``"aborted"`` or
        ``"preempted"`` (else ``ValueError``); after ``mark_preempting``,
        ``"failed"`` is recorded as ``"preempted"`` (as the server does).
        ``timeout`` is accepted for symmetry with ``Run``.
        """
        check_finish_status(status)
        if self.preempting and status == "failed":
            status = "preempted"
        if self._finishing:
            return
        self._finishing = True
        self._closed()
        self._metrics.close()
        self._set_status(status, ended=now_iso())

    def _set_status(self, status: str, *, ended: str | None) -> None:
        self._record["status"], self._record["ended_at"] = status, ended
        attempts = self._record.get("attempts") or []
        if attempts:
            attempts[-1].update(status=status, ended_at=ended)
        self._save_record()
        self.status = status
