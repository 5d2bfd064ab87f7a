"""The checkpoint saves of one online Run: at once (``wait=True``) or in the background
(docs/design/checkpoints.md#a-checkpoint, #save-and-restore).

``CheckpointSaver.save`` makes every refusal a caller can see without the
server synchronously: a bad or duplicate step, a symbolic link, an empty
directory, a non-regular file, a missing directory. With ``wait=False`` it
then snapshots the directory (``mado_tracking.staging``) and hands it to the
Run's upload thread (``mado_tracking.uploads``); the server still marks the
checkpoint ``complete`` only after it verified every byte, so a process that
dies leaves it ``pending`` and its snapshot staged. ``upload_left_behind``
(called when the same run starts again) queues those snapshots.
"""

import logging
import uuid
from concurrent.futures import Future
from pathlib import Path

from mado_tracking.checkpoints import SavedCheckpoint, check_metadata, check_step, upload_checkpoint
from mado_tracking.client import ApiClient
from mado_tracking.errors import ApiError, CheckpointError
from mado_tracking.lease import Lease
from mado_tracking.metrics import MetricSender
from mado_tracking.staging import StagedCheckpoint, earlier_run_staging_dir, left_behind, run_staging_dir, stage
from mado_tracking.tarstream import CheckpointTar
from mado_tracking.uploads import BackgroundUploads, max_pending_from_environment

logger = logging.getLogger("mado_tracking")


class CheckpointSaver:
    """Saves the checkpoints of Run ``run`` (a dict with ``id``, ``project``, ``external_id``).

    ``client`` is the Run's API client (used by waiting saves on the
    caller's thread); background uploads get their own client with the
    lease's headers. ``sender`` is flushed before each upload so metric points
    logged before a checkpoint reach the server first.
    """

    def __init__(self, *, client: ApiClient, run: dict, sender: MetricSender, lease: Lease, flush_timeout: float):
        self._client = client
        self._run_id = run["id"]
        self._label = run.get("external_id") or str(run["id"])
        self._sender = sender
        self._lease = lease
        self._flush_timeout = flush_timeout
        where = {"api_url": client.config.api_url, "project": run.get("project") or "", "external_id": self._label}
        self._staging = run_staging_dir(**where)
        self._earlier_staging = earlier_run_staging_dir(**where)  # an SDK that keyed by the URL's text
        self._keys: dict[int, str] = {}  # step → Idempotency-Key of a save not yet completed
        self._saved_steps: set[int] = set()
        self._left_behind: list[Future] = []
        self._uploads: BackgroundUploads | None = None
        self._upload_client: ApiClient | None = None

    def save(
        self,
        directory,
        step,
        *,
        includes_optimizer: bool,
        framework: str | None,
        wait: bool,
        world_size: int | None = None,
        metadata: dict | None = None,
    ) -> SavedCheckpoint | Future:
        """Save ``directory`` at ``step``; see ``Run.log_checkpoint`` for the arguments, result and errors.

        ``world_size``: a sharded ``torch-dcp`` checkpoint's (``wait=True`` only, ``mado_tracking.dcp``).
        """
        step = check_step(step, directory)
        metadata = check_metadata(metadata, directory)
        if step in self._saved_steps:
            raise CheckpointError(f"{directory}: step {step} is already saved in run {self._run_id}", field="step")
        # A second call for a step whose save failed replays the same registration instead of a 409.
        key = self._keys.setdefault(step, str(uuid.uuid4()))
        if not wait:
            return self._save_in_background(directory, step, key, includes_optimizer, framework, metadata)
        tar = CheckpointTar(directory)
        saved = self._upload(
            self._client,
            Path(directory),
            step,
            key,
            includes_optimizer,
            framework,
            tar=tar,
            world_size=world_size,
            metadata=metadata,
        )
        self._saved_steps.add(step)
        self._keys.pop(step, None)
        return saved

    def _save_in_background(
        self, directory, step: int, key: str, includes_optimizer: bool, framework: str | None, metadata: dict | None
    ) -> Future:
        uploads = self._background()
        uploads.reserve(step)
        try:
            staged = stage(
                directory,
                root=self._staging,
                step=step,
                run_id=self._run_id,
                idempotency_key=key,
                includes_optimizer=includes_optimizer,
                framework=framework,
                metadata=metadata,
            )
        except BaseException:
            uploads.release()
            raise
        self._saved_steps.add(step)
        self._keys.pop(step, None)
        return uploads.submit(staged)

    def upload_left_behind(self) -> list[int]:
        """Queue the snapshots an earlier process of this run left unuploaded; return their steps."""
        staged = left_behind(self._staging, run_id=self._run_id)
        if self._earlier_staging is not None:
            staged = sorted(
                staged + left_behind(self._earlier_staging, run_id=self._run_id), key=lambda item: item.step
            )
        if staged:
            logger.warning(
                "mado: run %s: uploading %d checkpoint(s) an earlier process left unuploaded (steps %s)",
                self._label,
                len(staged),
                ", ".join(str(item.step) for item in staged),
            )
        for item in staged:
            self._saved_steps.add(item.step)
            self._left_behind.append(self._background().submit(item, reserved=False))
        return [item.step for item in staged]

    def wait_left_behind(self) -> bool:
        """Wait for the uploads ``upload_left_behind`` queued (a failure is the upload thread's to report);
        True when there were any."""
        waiting, self._left_behind = self._left_behind, []
        for future in waiting:
            try:
                future.result()
            except Exception:  # noqa: BLE001 - logged by the upload thread, raised by finish()
                pass
        return bool(waiting)

    def close(self, *, show_progress: bool) -> list[str]:
        """Wait for the background uploads; return one line per failed one (empty: all complete)."""
        if self._uploads is None:
            return []
        try:
            futures = self._uploads.close(show_progress=show_progress)
        finally:
            self._upload_client.close()
        return [f"step {step}: {future.exception()}" for step, future in futures if future.exception()]

    def _background(self) -> BackgroundUploads:
        if self._uploads is None:
            self._upload_client = ApiClient(self._client.config, headers=self._lease.headers)
            self._uploads = BackgroundUploads(
                self._upload_staged, max_pending=max_pending_from_environment(), label=self._label
            )
        return self._uploads

    def _upload_staged(self, staged: StagedCheckpoint) -> SavedCheckpoint:
        staged.check_unchanged()
        return self._upload(
            self._upload_client,
            staged.content,
            staged.step,
            staged.idempotency_key,
            staged.includes_optimizer,
            staged.framework,
            progress=False,
            metadata=staged.metadata,
        )

    def _upload(
        self,
        client: ApiClient,
        directory: Path,
        step: int,
        key: str,
        includes_optimizer: bool,
        framework: str | None,
        *,
        tar: CheckpointTar | None = None,
        progress: bool = True,
        world_size: int | None = None,
        metadata: dict | None = None,
    ) -> SavedCheckpoint:
        unsent = self._sender.flush(self._flush_timeout)
        if unsent:
            logger.warning(
                "mado: %d metric points of run %s are not sent yet; saving the checkpoint at step %s anyway",
                unsent,
                self._run_id,
                step,
            )
        try:
            return upload_checkpoint(
                client,
                run_id=self._run_id,
                directory=directory,
                step=step,
                idempotency_key=key,
                includes_optimizer=includes_optimizer,
                framework=framework,
                tar=tar,
                progress=progress,
                world_size=world_size,
                metadata=metadata,
            )
        except ApiError as error:
            self._lease.lost_by(error)
            raise
