"""``start_run`` and the ``Run`` handle: one Run of training code on the mado server (SPEC F2, F29).

A Run is created on the server when ``start_run`` returns. Leaving a ``with``
block finishes it (``finished``, or ``failed`` on an exception, Ctrl-C
included); without ``with``, call ``run.finish()``. Whatever is still open at
interpreter exit is finished by an ``atexit`` hook: ``failed`` when the
program ended with an uncaught exception, else ``finished``.
"""

import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from mado_tracking import config as config_module
from mado_tracking._base import (
    FINISH_STATUSES,
    RUN_KINDS,
    RunBase,
    check_finish_status,
    check_kind,
    check_parameters,
    new_external_id,
)
from mado_tracking.checkpoints import SavedCheckpoint, check_step, upload_checkpoint
from mado_tracking.client import ApiClient
from mado_tracking.errors import ApiError, CheckpointError, MadoError
from mado_tracking.metrics import MetricSender, encode_metrics
from mado_tracking.tarstream import CheckpointTar

logger = logging.getLogger("mado_tracking")

__all__ = ["FINISH_STATUSES", "RUN_KINDS", "Run", "start_run"]

DEFAULT_FLUSH_TIMEOUT_S = 60.0
ENV_MODE = "MMT_MODE"
ENV_RUN_ID = "MMT_RUN_ID"


def start_run(project: str | None = None, name: str | None = None, kind: str = "training",
              parameters: Mapping | None = None, *, api_url: str | None = None, api_token: str | None = None,
              flush_timeout: float = DEFAULT_FLUSH_TIMEOUT_S, offline: bool | None = None,
              output: str | os.PathLike | None = None):
    """Create a Run on the mado server (or offline, in a local directory) and return its handle (SPEC F2, F18).

    Use it as a context manager (``with start_run(...) as run:``) or call
    ``run.finish()`` yourself.

    Args:
        project: slug of the Project (``MMT_PROJECT`` when None); the token's
            user must be a member or admin of it. Optional offline.
        name: free label shown in the UI (at most 200 characters; None = no name).
        kind: ``"training"``, ``"fine_tuning"``, ``"evaluation"`` or ``"other"``.
        parameters: JSON object of the run's parameters (str keys; values
            str, int, finite float, bool, None, lists and dicts of those);
            recorded once, never overwritten.
        api_url: server root such as ``http://127.0.0.1:8000`` (``MMT_API_URL``).
        api_token: API token (``MMT_API_TOKEN``), sent as ``Authorization: Bearer``.
        flush_timeout: seconds ``finish`` waits for buffered metrics to reach the server.
        offline: True = no server: everything goes to a local directory
            (``mado_tracking.offline``; ``mado sync DIR`` uploads it later).
            None = offline when ``MMT_MODE=offline``.
        output: offline only: the run's directory (default ``MMT_OFFLINE_DIR``,
            else ``./mado-offline/<run id>``).

    The run id (``external_id``) is ``MMT_RUN_ID`` when set (a Job's code:
    the worker pre-created that Run ``pending`` and the server attaches this
    process to it, docs/jobs.md), else a fresh random one.

    Returns:
        ``Run`` online, ``OfflineRun`` offline (same methods).

    Raises:
        ConfigError: online, API URL, token or project neither passed nor in the environment (named).
        ValueError: unknown ``kind``, ``parameters`` not a JSON object, or ``MMT_MODE`` not online/offline.
        ApiError: the server refused (unknown project → 404, viewer → 403, bad
            field → 400 naming it) or stayed unreachable through the retries.
        MadoError: offline, the directory already holds another run.
    """
    check_kind(kind)
    parameters = check_parameters(parameters)
    if offline is None:
        offline = _offline_from_environment()
    if offline:
        from mado_tracking.offline import start_offline_run

        return start_offline_run(project=project or os.environ.get(config_module.ENV_PROJECT) or None, name=name,
                                 kind=kind, parameters=parameters, output=output,
                                 external_id=_run_id_from_environment())
    config = config_module.resolve(api_url=api_url, api_token=api_token, project=project)
    body = {"project": config.project, "kind": kind, "parameters": parameters,
            "external_id": _run_id_from_environment() or new_external_id()}
    if name is not None:
        body["name"] = str(name)
    client = ApiClient(config)
    try:
        data = create_run(client, body)
    except BaseException:
        client.close()
        raise
    return Run(client=client, config=config, data=data, flush_timeout=flush_timeout)


def _run_id_from_environment() -> str | None:
    return os.environ.get(ENV_RUN_ID, "").strip() or None


def _offline_from_environment() -> bool:
    mode = os.environ.get(ENV_MODE, "").strip().lower()
    if mode not in ("", "online", "offline"):
        raise ValueError(f"{ENV_MODE} must be 'online' or 'offline', got {mode!r}")
    return mode == "offline"


def create_run(client: ApiClient, body: dict) -> dict:
    """POST runs/, retried on transient failures; a retry that finds its own Run already created returns it."""
    retried = False

    def note_retry():
        nonlocal retried
        retried = True

    try:
        return client.request("POST", "runs/", body=body, on_retry=note_retry)
    except ApiError as error:
        if not (retried and error.status == 409 and error.field == "external_id"):
            raise
        found = find_run(client, body["project"], body["external_id"])
        if found is None:
            raise
        return found


def find_run(client: ApiClient, project: str, external_id: str) -> dict | None:
    """The Run of ``project`` whose run id is ``external_id``, or None."""
    found = client.request("GET", "runs/", params={"project": project, "external_id": external_id})
    for run in found.get("results", []):
        if run.get("external_id") == external_id:
            return run
    return None


class Run(RunBase):
    """Handle of a Run on the server; created by ``start_run``.

    Attributes: ``id`` (int, the API id), ``external_id`` (the run id, str),
    ``url`` (absolute URL of the Run page), ``project`` (slug), ``name``,
    ``kind``, ``parameters`` (dict), ``status`` (last status known here).
    """

    def __init__(self, *, client: ApiClient, config: config_module.Config, data: dict, flush_timeout: float):
        self._client = client
        self._config = config
        self._flush_timeout = flush_timeout
        self._update(data)
        self._finishing = False
        self._finish_lock = threading.Lock()
        self._checkpoint_keys: dict[int, str] = {}  # step → Idempotency-Key of a save not yet completed
        self._saved_steps: set[int] = set()
        self._sender = MetricSender(config, self.id)
        self._opened()

    def _update(self, data: dict) -> None:
        self.id: int = data["id"]
        self.external_id: str = data.get("external_id", "")
        self.url: str = data.get("url", "")
        self.project: str = data.get("project", self._config.project)
        self.name: str = data.get("name", "")
        self.kind: str = data.get("kind", "")
        self.status: str = data.get("status", "")
        self.parameters: dict = data.get("parameters") or {}

    def __repr__(self) -> str:
        return f"<Run {self.id} {self.external_id} {self.name!r} {self.status}>"

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Queue metric values measured at ``step``; sent in the background (SPEC F2).

        Returns at once: no network I/O and no lock held while sending happens
        (a daemon thread posts batches about every second). The values are
        stamped with the current wall-clock time.

        Args:
            metrics: ``{key: value}``; key a non-empty str of at most 250
                characters (``"train.loss"``), value an int or float
                (numpy scalars too; NaN and ±inf are kept and stored).
            step: int >= 0, the number of steps completed or the step index;
                after a resume, keep counting from the checkpoint's step (F2).

        Raises:
            ValueError: a bad step, key or value (the message names the key);
                nothing of the call is queued then.
            TypeError: ``metrics`` is not a mapping.
            MadoError: the Run was already finished.
        """
        if self._finishing:
            raise MadoError(f"run {self.id} is finished; log_metrics must come before finish()")
        self._sender.add(encode_metrics(metrics, step, time.time()))

    def log_checkpoint(self, directory: str | os.PathLike, step: int, includes_optimizer: bool = False,
                       framework: str | None = None) -> SavedCheckpoint:
        """Save ``directory`` as this Run's checkpoint at ``step``; return it once stored and verified (SPEC F1).

        The directory is packed into one tar (the Run's artifact
        ``checkpoints/step-<step>.tar``) streamed to the server while every
        file's SHA-256 and the tar's are computed; memory does not grow with
        the checkpoint's size. Metric points logged before are sent first, so
        the curve and the checkpoint agree. A broken upload is retried with
        backoff; a progress bar shows on a terminal.

        Args:
            directory: the checkpoint directory: regular files in
                subdirectories, no symbolic link, no empty directory.
            step: number of steps completed (int >= 0); a resumed loop runs
                ``range(checkpoint.step, total)``.
            includes_optimizer: the directory holds optimizer state too.
            framework: free label, e.g. ``"torch"`` (at most 50 characters).

        Returns:
            ``SavedCheckpoint`` with ``.id``, ``.step``, ``.sha256`` (of the tar).

        Raises:
            CheckpointError: before any upload, naming the path: a symbolic
                link, an empty directory, a non-regular file, a missing
                directory, a negative step, a step already saved in this Run;
                after it: the server refused the tar or its manifest.
            ApiError: the server stayed unreachable through the retries.
            MadoError: the Run was already finished.
        """
        if self._finishing:
            raise MadoError(f"run {self.id} is finished; log_checkpoint must come before finish()")
        step = check_step(step, directory)
        if step in self._saved_steps:
            raise CheckpointError(f"{directory}: step {step} is already saved in run {self.id}", field="step")
        tar = CheckpointTar(directory)
        unsent = self._sender.flush(self._flush_timeout)
        if unsent:
            logger.warning("mado: %d metric points of run %s are not sent yet; saving the checkpoint at step %s "
                           "anyway", unsent, self.id, step)
        # A second call for a step whose save failed replays the same registration instead of a 409.
        key = self._checkpoint_keys.setdefault(step, str(uuid.uuid4()))
        saved = upload_checkpoint(self._client, run_id=self.id, directory=Path(directory), step=step,
                                  idempotency_key=key, includes_optimizer=includes_optimizer, framework=framework,
                                  tar=tar)
        self._saved_steps.add(step)
        self._checkpoint_keys.pop(step, None)
        return saved

    def log_training_data_stage(self, start_step: int, input_dataset_version_ids: Sequence[int],
                                checkpoint_id: int | None = None, metadata: Mapping | None = None) -> dict:
        """Record that from ``start_step`` on this Run trains on exactly ``input_dataset_version_ids`` (SPEC F21).

        Switch your data loader first, then record: recording changes no
        loader. Stages are immutable. Sending the same content again returns
        the same record, so the call is retried on transient failures (server
        unreachable, 5xx, 429) without risk of a duplicate.

        Args:
            start_step: the first step trained on the new set (int >= 0,
                greater than the previous stage's).
            input_dataset_version_ids: the FULL set of dataset version ids
                from ``start_step`` on (not only the added ones); not empty.
            checkpoint_id: optional id of a checkpoint of this Run at a step
                <= ``start_step`` (e.g. ``run.log_checkpoint(...).id``).
            metadata: optional JSON object, e.g. ``{"note": "synthetic data"}``.

        Returns:
            The stage as the API answers it: ``{"id", "start_step",
            "dataset_version_ids", "dataset_versions", "added", "removed",
            "checkpoint_id", "metadata", "created_by", "created_at", …}``.

        Raises:
            ValueError: a bad argument (nothing sent).
            ApiError: refused: 400 (field named: empty set, unknown ids,
                step, checkpoint), 409 (another set is recorded at that step
                — ``detail`` shows it — or the Run's Job has ended), or the
                server stayed unreachable through the retries.
            MadoError: the Run was already finished.
        """
        if self._finishing:
            raise MadoError(f"run {self.id} is finished; log_training_data_stage must come before finish()")
        body = data_stage_body(start_step, input_dataset_version_ids, checkpoint_id, metadata)
        return self._client.request("POST", f"runs/{self.id}/data-stages/", body=body)

    def finish(self, status: str = "finished", *, timeout: float | None = None) -> None:
        """Send the buffered metrics, then set the Run's final status on the server (SPEC F29).

        Calling it again does nothing. Metrics still unsent after ``timeout``
        seconds (default: ``flush_timeout`` of ``start_run``) are given up
        with a warning. If the server already holds another final state
        (the Job was aborted meanwhile), that state is kept, with a warning.

        Args:
            status: ``"finished"``, ``"failed"`` or ``"aborted"``.
            timeout: seconds to wait for the metric buffer to drain.

        Raises:
            ValueError: another ``status``.
            ApiError: the status could not be set (server unreachable through
                the retries, or refused).
        """
        check_finish_status(status)
        with self._finish_lock:
            if self._finishing:
                return
            self._finishing = True
        self._closed()
        interrupted = None
        try:
            unsent = self._sender.close(self._flush_timeout if timeout is None else timeout)
        except KeyboardInterrupt as exc:  # a second Ctrl-C: stop waiting for the network
            interrupted, status, unsent = exc, "failed", self._sender.pending
        if unsent:
            logger.warning("mado: %d metric points of run %s could not be sent before finishing", unsent, self.id)
        try:
            self._update(set_status(self._client, self.id, status, attempts=1 if interrupted else 5))
        finally:
            self._client.close()
        if interrupted is not None:
            raise interrupted


def data_stage_body(start_step, input_dataset_version_ids, checkpoint_id, metadata) -> dict:
    """The ``POST runs/{id}/data-stages/`` body, checked here so a bad argument fails before any request."""
    if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
        raise ValueError(f"start_step must be an int >= 0, got {start_step!r}")
    if isinstance(input_dataset_version_ids, (str, bytes)) or not isinstance(input_dataset_version_ids, Sequence):
        raise ValueError("input_dataset_version_ids must be a list of dataset version ids (the full set)")
    ids = list(input_dataset_version_ids)
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"input_dataset_version_ids must be a non-empty list of int ids (the full set), got {ids!r}")
    checkpoint_id = getattr(checkpoint_id, "id", checkpoint_id)  # a SavedCheckpoint is accepted too
    if checkpoint_id is not None and (isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int)):
        raise ValueError(f"checkpoint_id must be an int or None, got {checkpoint_id!r}")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ValueError("metadata must be a mapping (a JSON object) or None")
    return {"start_step": start_step, "input_dataset_version_ids": ids, "checkpoint_id": checkpoint_id,
            "metadata": dict(metadata or {})}


def set_status(client: ApiClient, run_id: int, status: str, *, attempts: int = 5) -> dict:
    """PATCH the Run's final status; another final state already on the server is kept (warning). The Run's JSON."""
    try:
        return client.request("PATCH", f"runs/{run_id}/", body={"status": status}, attempts=attempts)
    except ApiError as error:
        if error.status != 409:
            raise
        data = client.request("GET", f"runs/{run_id}/", attempts=attempts)
        logger.warning("mado: run %s already ended as %s on the server; not marked %s",
                       run_id, data.get("status"), status)
        return data
