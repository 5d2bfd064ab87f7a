"""The ``Run`` handle that ``start_run`` (``mado_tracking.start``) returns: one Run of training code on the mado server
(docs/design/resume.md#steps-continue; docs/design/runs.md#resume-modes, #one-writer-process, #states;
docs/design/sweeps.md#sweeps; docs/design/interfaces.md#surfaces).

A Run is created (or resumed under its id, ``mado_tracking.resume_mode``) on
the server when ``start_run`` returns. Leaving a ``with`` block finishes it
(``finished``, or ``failed`` on an exception, Ctrl-C and ``sys.exit(1)``
included; ``preempted`` instead after ``run.mark_preempting()``); without
``with``, call ``run.finish()``. Whatever is still open at interpreter exit is
finished by an ``atexit`` hook: by the code given to ``sys.exit`` when the
program called it (0 or None: ``finished``; else ``failed``, or ``preempted``
after ``mark_preempting``); otherwise ``failed`` when the program ended with
an uncaught exception, ``preempted`` after ``mark_preempting``, else
``finished``. To see that code the SDK wraps ``sys.exit`` when it is imported
(as W&B's does), so ``sys.exit(main())`` is seen too; ``raise SystemExit(n)``
and ``os._exit`` go unseen.
While it is open the process holds the Run's write lease and heartbeats
(``mado_tracking.lease``).
"""

import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path

from mado_tracking import config as config_module
from mado_tracking import console, resume_fetch, system, unsent
from mado_tracking._base import (
    FINISH_STATUSES,
    RUN_KINDS,
    RunBase,
    check_finish_status,
)
from mado_tracking.checkpoints import SavedCheckpoint
from mado_tracking.client import ApiClient
from mado_tracking.errors import ApiError, CheckpointError, MadoError
from mado_tracking.heartbeat import Heartbeat
from mado_tracking.lease import DEFAULT_HEARTBEAT_INTERVAL_S, Lease
from mado_tracking.metrics import MetricSender
from mado_tracking.points import metric_points
from mado_tracking.resume_mode import (
    clear_resume_file,
)
from mado_tracking.saving import CheckpointSaver
from mado_tracking.stages import data_stage_body
from mado_tracking.staging import run_staging_dir
from mado_tracking.status import set_preempting, set_status
from mado_tracking.training_state import with_training_state

logger = logging.getLogger("mado_tracking")

__all__ = ["FINISH_STATUSES", "RUN_KINDS", "Run"]

DEFAULT_FLUSH_TIMEOUT_S = 60.0


class Run(RunBase):
    """Handle of a Run on the server; created by ``start_run``.

    Attributes: ``id`` (int, the API id), ``external_id`` (the run id, str),
    ``url`` (absolute URL of the Run page), ``project`` (slug), ``name``,
    ``kind``, ``parameters`` (dict), ``status`` (last status known here),
    ``step`` (the step the next ``log_metrics`` without ``step=`` uses: 0 for
    a new run, the last step + 1 after a resume), ``resumed`` (bool),
    ``rank`` and ``world_size`` (0 and 1 but under torchrun, docs/design/worker.md#distributed),
    ``resume_count``, ``fencing_token`` (int or None), ``preempting`` (bool),
    ``lost`` (another process took the Run over, or it ended on the server).
    """

    def __init__(
        self,
        *,
        client: ApiClient,
        config: config_module.Config,
        data: dict,
        flush_timeout: float,
        heartbeat_interval: float | None = None,
        resume_file: Path | None = None,
    ):
        self._client = client
        self._config = config
        self._flush_timeout = flush_timeout
        self._resume_file = resume_file
        self._data = data
        self._update(data)
        self.resumed: bool = bool(data.get("resumed"))
        self.resume_count: int = data.get("resume_count") or 0
        self.fencing_token: int | None = data.get("fencing_token")
        last_step = data.get("last_step")
        self.step = max(data.get("step_floor") or 0, 0 if last_step is None else last_step + 1)
        console.announce(external_id=self.external_id, resumed=self.resumed, step=self.step, where=self.url)
        self._lease = Lease(
            run_label=self.external_id or str(self.id),
            token=self.fencing_token,
            heartbeat_interval=heartbeat_interval or data.get("heartbeat_interval") or DEFAULT_HEARTBEAT_INTERVAL_S,
        )
        client.session.headers.update(self._lease.headers)
        crash_timeout = data.get("crash_timeout")
        if crash_timeout and self._lease.heartbeat_interval >= crash_timeout:
            logger.warning(
                "mado: heartbeats every %g s (MMT_HEARTBEAT_INTERVAL) are not within the server's crash "
                "timeout of %g s: run %s will be marked crashed between them",
                self._lease.heartbeat_interval,
                crash_timeout,
                self._lease.run_label,
            )
        self._finishing = False
        self._dropping_warned = False
        self._finish_lock = threading.Lock()
        keep_dir = run_staging_dir(api_url=config.api_url, project=self.project, external_id=self.external_id)
        self._sender = MetricSender(config, self.id, lease=self._lease, keep_dir=keep_dir)
        # points a crashed earlier start of this run kept (docs/design/runs.md#liveness)
        self._sender.add(
            unsent.take_for_run(api_url=config.api_url, project=self.project, external_id=self.external_id)
        )
        self._heartbeat = Heartbeat(config, self.id, lease=self._lease)
        self._checkpoints = CheckpointSaver(
            client=client, run=data, sender=self._sender, lease=self._lease, flush_timeout=flush_timeout
        )
        interval = system.interval_from_env()
        self._system = system.SystemMonitor(self._log_system, interval) if interval > 0 else None
        self._opened()
        self._checkpoints.upload_left_behind()
        self._resume_plan = None
        if self.resumed:  # docs/design/resume.md#resume-anywhere
            resume_fetch.on_resumed_start(self)

    @property
    def lost(self) -> bool:
        """True once another process took this Run over or it ended on the server (nothing is sent any more)."""
        return self._lease.lost

    def __repr__(self) -> str:
        return f"<Run {self.id} {self.external_id} {self.name!r} {self.status}>"

    def shared_data(self) -> dict:
        """What the server answered when this Run started, for the other ranks' ``RankRun``
        (docs/design/worker.md#distributed)."""
        return dict(self._data)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None, *, all_ranks: bool = False) -> None:
        """Queue metric values measured at ``step``; sent in the background (docs/design/resume.md#steps-continue;
        docs/design/runs.md#resume-modes).

        Returns at once: no network I/O and no lock held while sending happens
        (a daemon thread posts batches about every second). The values are
        stamped with the current wall-clock time. Once the Run is ``lost``
        the values are dropped (one warning), not raised: training goes on.

        Args:
            metrics: ``{key: value}``; key a non-empty str of at most 250
                characters, no NUL (``"train.loss"``), value an int or float
                (numpy scalars too; NaN and ±inf are kept and stored).
            step: int in [0, 2**63), the number of steps completed or the step index;
                None = ``run.step``. ``run.step`` then moves past the step
                used. After a resume the server drops points below the
                resumed run's first step (one warning per key); those of
                steps from the checkpoint ``run.resume_checkpoint()``
                returned up to there are not sent (logged before the stop).
            all_ranks: under torchrun, store this rank's values under
                ``rank<k>/`` keys; every rank calls it (docs/design/worker.md#distributed). Without it
                only rank 0's values are stored.

        Raises:
            ValueError: a bad step, key or value (the message names the key);
                nothing of the call is queued then.
            TypeError: ``metrics`` is not a mapping.
            MadoError: the Run was already finished.
        """
        if self._finishing:
            raise MadoError(f"run {self.id} is finished; log_metrics must come before finish()")
        points = self._encode(metrics, step, all_ranks)
        if not points:
            return
        if self._lease.lost:
            if self._sender.keep(points):
                return
            if not self._dropping_warned:
                self._dropping_warned = True
                logger.warning(
                    "mado: run %s is no longer written by this process (see the error above); "
                    "log_metrics values are dropped from now on",
                    self.external_id,
                )
            return
        self._sender.add(points)

    def _find_resume_checkpoint(self):
        return resume_fetch.for_run(self)

    def _log_system(self, values: dict) -> None:
        """Queue a system metrics sample (``system/…`` keys, docs/design/interfaces.md#system-metrics) at the step
        training logged last, leaving ``self.step`` as it is."""
        if not self._finishing and not self._lease.lost:
            self._sender.add(metric_points(values, max(self.step - 1, 0), time.time()))

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
        """Save ``directory`` as this Run's checkpoint at ``step``
        (docs/design/checkpoints.md#a-checkpoint, #save-and-restore, #training-state).

        The directory goes up as one tar (the Run's artifact
        ``checkpoints/step-<step>.tar``), streamed while each file's SHA-256
        and the tar's are computed from one read of each byte; memory does not
        grow with its size. Metric points logged before are sent first. A
        broken upload is retried with backoff. The server marks the checkpoint
        ``complete`` only once it verified every byte.

        ``wait=True`` returns once it is complete. ``wait=False`` returns once
        the files are snapshotted (``mado_tracking.staging``), so
        ``directory`` may change at once, and uploads in the background
        (``mado_tracking.uploads``: bounded queue, ``MMT_CHECKPOINT_QUEUE``);
        ``finish()`` waits and raises a failure, also logged when it happens;
        a process that dies leaves it ``pending`` for the next start of this
        run to upload.

        ``directory``: regular files in subdirectories, no symbolic link, no
        empty directory. ``step``: steps completed (int >= 0; a resumed loop
        runs ``range(checkpoint.step, total)``). ``framework``: a label of at
        most 50 characters. ``metadata``: a JSON object kept with the checkpoint
        (at most 64 KiB; ``training_state``, ``preemption``: docs/design/checkpoints.md#metadata).
        Its ``training_state`` is added from ``state`` (the live objects the
        directory was saved from: ``{"model", "optimizer", "scheduler",
        "scaler", "generators", "data_position", "rng"}``, fingerprinted now),
        else from the directory's ``mado-checkpoint.json``
        (``mado_tracking.torch.save_checkpoint`` writes it); none: "unknown".
        Returns ``SavedCheckpoint`` (``.id``, ``.step``,
        ``.sha256`` of the tar), with ``wait=False`` a ``Future`` of it.

        Raises:
            CheckpointError: at the call, with either ``wait``, naming the
                path: a symbolic link, an empty directory, a non-regular file,
                a missing directory, a bad step, a step already saved here;
                ``wait=True`` also after the upload: the server refused the
                tar or manifest, or another process saved the step.
            ApiError: ``wait=True``: the server stayed unreachable through
                the retries, or the Run was lost (409 ``lease_lost`` /
                ``run_ended``).
            ValueError: ``wait=False`` and ``MMT_CHECKPOINT_QUEUE`` is not a whole number >= 1.
            MadoError: the Run was already finished, or ``lost`` before.
        """
        metadata = with_training_state(directory, metadata, state, step)
        if self._finishing:
            raise MadoError(f"run {self.id} is finished; log_checkpoint must come before finish()")
        self._require_lease("log_checkpoint")
        self._starting_below(step, "log_checkpoint")
        return self._checkpoints.save(
            directory, step, includes_optimizer=includes_optimizer, framework=framework, wait=wait, metadata=metadata
        )

    def _save_sharded(self, directory, step: int, includes_optimizer: bool, world_size: int) -> SavedCheckpoint:
        """Rank 0's upload of a sharded checkpoint directory (``mado_tracking.dcp``), waiting until complete."""
        if self._finishing:
            raise MadoError(f"run {self.id} is finished; log_checkpoint_distributed must come before finish()")
        self._require_lease("log_checkpoint_distributed")
        self._starting_below(step, "log_checkpoint_distributed")
        return self._checkpoints.save(
            directory,
            step,
            includes_optimizer=includes_optimizer,
            framework="torch-dcp",
            wait=True,
            world_size=world_size,
        )

    def log_training_data_stage(
        self,
        start_step: int,
        input_dataset_version_ids: Sequence[int],
        checkpoint_id: int | None = None,
        metadata: Mapping | None = None,
    ) -> dict:
        """Record that from ``start_step`` on this Run trains on exactly ``input_dataset_version_ids``
        (docs/design/runs.md#data-stages-sdk).

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
                server stayed unreachable through the retries; 409
                ``lease_lost`` / ``run_ended`` when the Run was lost.
            MadoError: the Run was already finished, or ``lost`` before.
        """
        if self._finishing:
            raise MadoError(f"run {self.id} is finished; log_training_data_stage must come before finish()")
        self._require_lease("log_training_data_stage")
        body = data_stage_body(start_step, input_dataset_version_ids, checkpoint_id, metadata)
        try:
            return self._client.request("POST", f"runs/{self.id}/data-stages/", body=body)
        except ApiError as error:
            self._lease.lost_by(error)
            raise

    def alert(self, title: str, text: str = "", level: str = "warn") -> int | None:
        """Send an alert from this Run through its Project's alert rules on "alert sent by the run"
        (docs/design/alerts.md#run-alert): email, webhooks, chat, as the Project set them up.

        Args:
            title: one line, 1 to 300 characters, e.g. ``"loss plateaued"``.
            text: optional longer text.
            level: ``"info"``, ``"warn"`` (default) or ``"error"``.

        Returns:
            How many rules sent it (0: no rule listens), or None when the
            server refused it (a warning says why: too many alerts a minute
            from this Run, or the Run ended). Training goes on either way.

        Raises:
            ValueError: a bad ``title`` or ``level`` (nothing sent).
        """
        if not title or len(title) > 300:
            raise ValueError("title must be 1 to 300 characters")
        if level not in ("info", "warn", "error"):
            raise ValueError("level must be 'info', 'warn' or 'error'")
        body = {"title": title, "text": text, "level": level}
        try:
            return self._client.request("POST", f"runs/{self.id}/alerts/", body=body, attempts=3)["fired"]
        except ApiError as error:
            logger.warning("alert %r not sent: %s", title, error)
            return None

    def _require_lease(self, what: str) -> None:
        if self._lease.lost:
            raise MadoError(
                f"run {self.external_id} is no longer written by this process (taken over by another "
                f"one, or ended on the server); {what} sent nothing"
            )

    def mark_preempting(self) -> None:
        """Tell the server this run is being preempted (docs/design/sweeps.md#sweeps); safe to call from a signal
        handler.

        Sticky: from now on leaving the run any other way than a clean exit
        (``with`` left normally or by ``sys.exit(0)``) ends it ``preempted``,
        as does the interpreter exit of a run left open; a sweep then
        requeues it. Calling it again does nothing. The ``PATCH`` is tried
        a few times quickly on its own connection; when it fails the server
        learns it at the end (a warning says so). Never raises.
        """
        if self.preempting or self._finishing:
            return
        self.preempting = True
        if not self._lease.lost:
            self.status = (set_preempting(self._config, self._lease, self.id) or {}).get("status", self.status)

    def finish(self, status: str = "finished", *, timeout: float | None = None) -> None:
        """Wait for the background checkpoint uploads, send the buffered metrics, then set the Run's final status
        on the server (docs/design/interfaces.md#surfaces; docs/design/checkpoints.md#save-and-restore).

        Calling it again does nothing. Checkpoints saved with ``wait=False``
        are waited for first (a progress bar on a terminal; Ctrl-C stops
        waiting and leaves them for the next start of the run). Metrics still unsent after ``timeout``
        seconds (default: ``flush_timeout`` of ``start_run``) are given up
        with a warning. If the server already holds another final state
        (the Job was aborted meanwhile), that state is kept, with a warning.
        A ``lost`` Run is left to the process that holds it. After
        ``mark_preempting`` the server turns ``failed`` into ``preempted``.
        ``finished`` removes ``.mado/resume.json`` (nothing to resume).

        Args:
            status: ``"finished"``, ``"failed"``, ``"aborted"`` or ``"preempted"``.
            timeout: seconds to wait for the metric buffer to drain.

        Raises:
            ValueError: another ``status``.
            ApiError: the status could not be set (server unreachable through
                the retries, or refused).
            CheckpointError: after the status is set, when a background
                checkpoint upload failed (each step and its reason named).
        """
        check_finish_status(status)
        with self._finish_lock:
            if self._finishing:
                return
            self._finishing = True
        self._closed()
        if self._system is not None:
            self._system.stop()
        interrupted, failed = None, []
        try:
            failed = self._checkpoints.close(show_progress=sys.stderr.isatty())
            unsent = self._sender.close(self._flush_timeout if timeout is None else timeout)
        except KeyboardInterrupt as exc:  # a second Ctrl-C: stop waiting for the network
            interrupted, status, unsent = exc, "failed", self._sender.pending
        if unsent and not self._lease.lost:
            logger.warning("mado: %d metric points of run %s could not be sent before finishing", unsent, self.id)
        self._heartbeat.close()  # beats went on while uploads and metrics drained; none may follow the end
        try:
            if not self._lease.lost:
                data = set_status(self._client, self.id, status, attempts=1 if interrupted else None, lease=self._lease)
                if data is not None:
                    self._update(data)
        finally:
            self._client.close()
        if self.status == "finished" and self._resume_file is not None:
            clear_resume_file(self._resume_file, self.external_id)
        if interrupted is not None:
            raise interrupted
        if failed:
            raise CheckpointError(
                f"run {self.external_id}: {len(failed)} checkpoint upload(s) failed: "
                f"{'; '.join(failed)}. They are uploaded when this run starts again (its id with "
                "resume='allow'), except those the server refused (above)"
            )
