"""Saving a checkpoint directory on the server: register, stream the tar, complete
(docs/design/checkpoints.md#a-checkpoint; docs/api.md).

``upload_checkpoint`` makes the three calls of the contract. The tar is
never held in memory: ``CheckpointTar`` yields it in 1 MiB chunks, hashing
every file and the whole tar in the same pass, and ``requests`` sends it
with a ``Content-Length`` (the object has a ``len()``). A broken upload
(connection error, 502, 503, 504, 408, 429; a 500 a few times) is retried
with backoff for up to ``MMT_RETRY_TIMEOUT`` seconds by building the tar
again and PUTting it again to the same checkpoint (re-read from the files,
never buffered); a 4xx or 507 is final, the body is not sent again: the server replaces a
pending upload, and the registration is replayed with the same
``Idempotency-Key``. When the checkpoint resource says ``direct_upload``
(S3 storage), the tar goes straight to the bucket in presigned parts, one
part buffered at a time (``part_size``, 64 MiB by default), and the server's
verification task is polled until the checkpoint is complete. A direct
upload the SDK gives up on is aborted through its presigned ``abort_url``.
"""

import json
import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import requests
from tqdm import tqdm
from urllib3.exceptions import NameResolutionError

from mado_tracking.client import (
    CONNECT_TIMEOUT_S,
    READ_TIMEOUT_S,
    ApiClient,
    Backoff,
    Retrier,
    body_detail,
    is_transient,
    retry_after_seconds,
)
from mado_tracking.declaration import checkpoint_declaration
from mado_tracking.errors import ApiError, CheckpointError
from mado_tracking.lease import LOST_CODES
from mado_tracking.tarstream import CheckpointTar

logger = logging.getLogger("mado_tracking")

UPLOAD_READ_TIMEOUT_S = 600.0  # the server verifies the last bytes before it answers
VERIFY_TIMEOUT_S = 3600.0
# A presigned URL's host name this machine has not resolved once in this long is a setting to fix, not an outage to
# wait out (a storage that refuses or drops connections is retried for MMT_RETRY_TIMEOUT).
STORAGE_UNREACHABLE_S = 30.0
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
_BODY_CHUNK = 1 << 20


@dataclass(frozen=True)
class SavedCheckpoint:
    """A saved checkpoint: ``id`` (API id; None offline), ``step``, ``sha256`` (hex SHA-256 of the tar),
    ``tar_size`` (bytes), ``file_count``, ``total_bytes`` (sum of the files' sizes) and ``location``
    (``checkpoints/step-<N>.tar`` on the server, or the local directory offline)."""

    id: int | None
    step: int
    sha256: str
    tar_size: int
    file_count: int
    total_bytes: int
    location: str

    @classmethod
    def from_resource(cls, resource: dict) -> "SavedCheckpoint":
        return cls(
            id=resource["id"],
            step=resource["step"],
            sha256=resource.get("tar_sha256") or "",
            tar_size=resource.get("tar_size") or 0,
            file_count=resource.get("file_count") or 0,
            total_bytes=resource.get("total_bytes") or 0,
            location=resource.get("artifact_path") or "",
        )


def check_step(step, directory) -> int:
    """``step`` as an int >= 0 (the number of steps completed); ``CheckpointError`` naming ``directory`` otherwise."""
    if isinstance(step, bool) or not hasattr(step, "__index__"):
        raise CheckpointError(f"{directory}: step must be an int >= 0 (steps completed), got {step!r}", field="step")
    step = step.__index__()
    if step < 0:
        raise CheckpointError(f"{directory}: step must be >= 0 (steps completed), got {step}", field="step")
    return step


def check_metadata(metadata, directory) -> dict | None:
    """``metadata`` of ``log_checkpoint``: None or a JSON object (docs/design/checkpoints.md#metadata); else
    ``CheckpointError`` naming ``directory``, at the call, before anything is saved."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise CheckpointError(
            f"{directory}: metadata must be a dict (a JSON object), got {metadata!r}", field="metadata"
        )
    try:
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(
            f"{directory}: metadata is not JSON with finite numbers ({exc})", field="metadata"
        ) from None
    return metadata


def progress_bar(total: int, step: int, show: bool = True):
    """A tqdm bar in bytes, shown only when ``show`` and stderr is a terminal."""
    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=f"checkpoint step {step}",
        disable=not show or not sys.stderr.isatty(),
        leave=False,
    )


def upload_checkpoint(
    client: ApiClient,
    *,
    run_id: int,
    directory,
    step: int,
    idempotency_key: str,
    includes_optimizer: bool = False,
    framework: str | None = None,
    tar: CheckpointTar | None = None,
    attempts: int | None = None,
    verify_timeout: float = VERIFY_TIMEOUT_S,
    progress: bool = True,
    world_size: int | None = None,
    metadata: dict | None = None,
) -> SavedCheckpoint:
    """Save ``directory`` as Run ``run_id``'s checkpoint at ``step``; return it once ``complete``
    (docs/design/checkpoints.md#a-checkpoint).

    ``tar`` is the ``CheckpointTar`` of ``directory`` when the caller already
    built it (its scan made the refusals); otherwise it is built here, so a
    symbolic link, an empty directory or a non-regular file raises
    ``CheckpointError`` before any request. ``idempotency_key`` identifies
    this save: a replay of the registration returns the same checkpoint, and
    one that is already complete is returned without uploading again.
    ``progress``: show a progress bar in bytes (on a terminal only).
    ``world_size``: the processes that wrote a sharded ``torch-dcp``
    checkpoint (docs/design/worker.md#distributed); the server completes it only with every rank's shard.
    ``metadata``: a JSON object kept with the checkpoint (docs/design/checkpoints.md#metadata).

    Raises:
        CheckpointError: the step is already saved in the Run (409), the
            server refused the registration (400) or the tar / manifest
            (``Checkpoint <id> <what> mismatch``), or the directory changed
            while it was being sent.
        ApiError: the server stayed unreachable (or answered 5xx) through
            ``MMT_RETRY_TIMEOUT`` seconds (or ``attempts`` tries, when given;
            a direct upload is then aborted), or refused for another reason (507: the server's storage is full (403,
            404, or 409 ``lease_lost`` / ``run_ended``: the Run was taken over by
            another process or ended on the server, docs/design/runs.md#one-writer-process).
    """
    tar = tar if tar is not None else CheckpointTar(directory)
    resource = _register(
        client,
        run_id=run_id,
        directory=directory,
        step=step,
        idempotency_key=idempotency_key,
        includes_optimizer=includes_optimizer,
        framework=framework,
        world_size=world_size,
        metadata=metadata,
    )
    if resource["state"] == "complete":
        return SavedCheckpoint.from_resource(resource)
    if resource["state"] != "pending":
        raise CheckpointError(
            f"{directory}: checkpoint {resource['id']} at step {step} is {resource['state']}", field="step"
        )
    with progress_bar(len(tar), step, progress) as bar:
        upload = _DirectUpload if resource.get("direct_upload") else _ServerUpload
        return upload(client, resource, directory, bar, attempts, verify_timeout).run(tar)


def _register(
    client: ApiClient, *, run_id, directory, step, idempotency_key, includes_optimizer, framework, world_size, metadata
) -> dict:
    body = {"step": step, "framework": framework or "", "includes_optimizer": bool(includes_optimizer)}
    if world_size is not None:  # a sharded torch-dcp checkpoint (docs/design/worker.md#distributed)
        body["world_size"] = world_size
    if metadata:
        body["metadata"] = metadata
    try:
        return client.request(
            "POST", f"runs/{run_id}/checkpoints/", body=body, headers={"Idempotency-Key": idempotency_key}
        )
    except ApiError as error:
        if error.status == 409 and error.code not in LOST_CODES:
            raise CheckpointError(
                f"{directory}: cannot save step {step} in run {run_id}: {error.detail}", field=error.field
            ) from None
        if error.status == 400:
            raise CheckpointError(
                f"{directory}: the server refused the checkpoint (field {error.field}): {error.detail}",
                field=error.field,
            ) from None
        raise


def _backoff() -> Backoff:
    return Backoff(BACKOFF_BASE_S, BACKOFF_CAP_S)


def _retrier(what: str, attempts: int | None) -> Retrier:
    return Retrier(what, attempts=attempts, backoff=_backoff())


class _Chunks:
    """A bytes-like buffer sent as an iterable of known length (``Content-Length``, no copy)."""

    def __init__(self, view: memoryview):
        self._view = view

    def __len__(self) -> int:
        return len(self._view)

    def __iter__(self):
        for start in range(0, len(self._view), _BODY_CHUNK):
            yield self._view[start : start + _BODY_CHUNK]


class _Upload:
    """One checkpoint's upload with its retries; ``run(tar)`` returns the completed ``SavedCheckpoint``."""

    def __init__(self, client: ApiClient, resource: dict, directory, bar, attempts: int | None, verify_timeout: float):
        self.client = client
        self.id = resource["id"]
        self.step = resource["step"]
        self.directory = Path(directory)
        self.bar = bar
        self.attempts = attempts
        self.verify_timeout = verify_timeout

    def new_tar(self) -> CheckpointTar:
        tar = CheckpointTar(self.directory, on_bytes=None if self.bar.disable else self.bar.update)
        self.bar.reset(total=len(tar))
        return tar

    def declaration(self, tar: CheckpointTar) -> dict:
        return checkpoint_declaration(tar_size=len(tar), tar_sha256=tar.sha256, manifest=tar.manifest)

    def sent_manifest(self, tar: CheckpointTar) -> list[dict]:
        """The files' ``{path, size, sha256}`` of ``tar``; read again when ``tar`` was not sent to its end."""
        if len(tar.manifest) < len(tar.files):
            tar = CheckpointTar(self.directory)
            for _ in tar:
                pass
        return tar.manifest

    def retry_or_raise(
        self, retrier: Retrier, reason: str, status: int | None = None, retry_after: float | None = None
    ) -> None:
        if not retrier.pause(reason, status=status, retry_after=retry_after):
            raise ApiError(
                f"{self.directory}: uploading checkpoint {self.id} (step {self.step}) failed "
                f"{retrier.tries} times; last: {reason}; {retrier.summary()}"
            )

    def refused(self, response: requests.Response, what: str) -> CheckpointError:
        error = self.client.error_from(response, "PUT", what)
        return CheckpointError(
            f"{self.directory}: the server refused checkpoint {self.id} (step {self.step}): {error.detail}",
            field=error.field,
        )

    def complete(self, body: dict) -> dict:
        try:
            return self.client.request("POST", f"checkpoints/{self.id}/complete/", body=body)
        except ApiError as error:
            if error.status in (400, 409) and error.code not in LOST_CODES:
                raise CheckpointError(
                    f"{self.directory}: checkpoint {self.id} (step {self.step}) was not completed: {error.detail}",
                    field=error.field,
                ) from None
            raise


class _ServerUpload(_Upload):
    """``PUT checkpoints/{id}/tar`` through the web process, then ``complete``."""

    def run(self, tar: CheckpointTar) -> SavedCheckpoint:
        if not self.bar.disable:
            tar.on_bytes = self.bar.update
        url = self.client.url(f"checkpoints/{self.id}/tar")
        retrier = _retrier(f"uploading checkpoint step {self.step}", self.attempts)
        while True:
            tar = tar if tar is not None else self.new_tar()
            retry_after = status = None
            try:
                response = self.client.session.put(
                    url,
                    data=tar,
                    headers={"Content-Type": "application/x-tar"},
                    timeout=(CONNECT_TIMEOUT_S, UPLOAD_READ_TIMEOUT_S),
                )
            except requests.RequestException as exc:
                reason = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 400:
                    answer = self.client.decode(response, "PUT", url) or {}
                    if answer.get("received_bytes") == len(tar):
                        return SavedCheckpoint.from_resource(self.complete(self.declaration(tar)))
                    reason = f"the server received {answer.get('received_bytes')} bytes, {len(tar)} were sent"
                elif response.status_code == 409:
                    return self._already_complete(response, tar, url)
                elif not is_transient(response.status_code):
                    raise self.refused(response, url)
                else:
                    status, retry_after = response.status_code, retry_after_seconds(response)
                    reason = f"HTTP {status}: {body_detail(response)}"
            self.retry_or_raise(retrier, reason, status, retry_after)
            tar = None

    def _already_complete(self, response: requests.Response, tar: CheckpointTar, url: str) -> SavedCheckpoint:
        error = self.client.error_from(response, "PUT", url)
        if error.code in LOST_CODES:  # another process took the Run over: the caller's Run learns it
            raise error
        # An earlier attempt completed it (its answer got lost): fine if it holds these very files.
        resource = self.client.request("GET", f"checkpoints/{self.id}/")
        if resource.get("state") == "complete" and resource.get("tar_size") == len(tar):
            stored = sorted((e["path"], e["size"], e["sha256"]) for e in resource.get("manifest") or [])
            if stored == sorted((e["path"], e["size"], e["sha256"]) for e in self.sent_manifest(tar)):
                return SavedCheckpoint.from_resource(resource)
        raise self.refused(response, f"checkpoints/{self.id}/tar")


class _DirectUpload(_Upload):
    """Presigned multipart upload straight to S3 (``upload-parts``), ``complete`` (202), then poll."""

    storage_answered = False  # the presigned URLs' host answered a request of this upload

    def run(self, tar: CheckpointTar) -> SavedCheckpoint:
        if not self.bar.disable:
            tar.on_bytes = self.bar.update
        retrier = _retrier(f"uploading checkpoint step {self.step}", self.attempts)
        parts_session = requests.Session()  # no Authorization header: the presigned URL carries the signature
        plan = None  # the multipart upload this process started and has not completed
        try:
            while True:
                tar = tar if tar is not None else self.new_tar()
                plan = self.client.request("POST", f"checkpoints/{self.id}/upload-parts/", body={"tar_size": len(tar)})
                try:
                    parts = self._put_parts(parts_session, tar, plan)
                except _PartFailed as exc:
                    reason = str(exc)
                else:
                    body = {**self.declaration(tar), "upload_id": plan["upload_id"], "parts": parts}
                    accepted = self.complete(body)
                    plan = None  # completed on the server: nothing of it is left to abort
                    resource = self._wait_verified(accepted)
                    if resource["state"] == "complete":
                        return SavedCheckpoint.from_resource(resource)
                    reason = f"verification failed: {resource.get('error')}"
                self.retry_or_raise(retrier, reason)  # a new upload-parts replaces (aborts) the open upload
                tar = None
        finally:
            if plan is not None:
                self._abort(parts_session, plan)
            parts_session.close()

    def _abort(self, session: requests.Session, plan: dict) -> None:
        """Abort the unfinished upload through its presigned ``abort_url``; one try, never raises.

        When it cannot be reached (the storage is the part that is down) the
        server's clean-up of stale uploads removes the parts later.
        """
        try:
            response = session.delete(plan["abort_url"], timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
        except (KeyError, requests.RequestException) as exc:
            reason = f"{type(exc).__name__}: {exc}"
        else:
            if response.status_code < 300 or response.status_code == 404:  # 404: already gone
                logger.info("mado: aborted the unfinished upload of checkpoint step %s", self.step)
                return
            reason = f"HTTP {response.status_code}: {body_detail(response, 200)}"
        logger.warning(
            "mado: could not abort the unfinished upload of checkpoint step %s (%s); the server removes it later",
            self.step,
            reason,
        )

    def _put_parts(self, session: requests.Session, tar: CheckpointTar, plan: dict) -> list[dict]:
        """Send the tar as parts of ``plan["part_size"]`` bytes, holding one part; ``[{part_number, etag}]``."""
        part_size, urls = plan["part_size"], plan["urls"]
        if len(urls) != math.ceil(len(tar) / part_size):
            raise ApiError(f"upload-parts answered {len(urls)} URLs for {len(tar)} bytes in parts of {part_size}")
        buffer = bytearray(min(part_size, len(tar)))
        view, filled, parts = memoryview(buffer), 0, []
        for chunk in tar:
            data = memoryview(chunk)
            while data:
                take = min(len(data), part_size - filled)
                view[filled : filled + take] = data[:take]
                filled, data = filled + take, data[take:]
                if filled == part_size:
                    parts.append(self._put_part(session, urls[len(parts)], view[:filled], len(parts) + 1))
                    filled = 0
        if filled:
            parts.append(self._put_part(session, urls[len(parts)], view[:filled], len(parts) + 1))
        return parts

    def _put_part(self, session: requests.Session, url: str, data: memoryview, number: int) -> dict:
        retrier = _retrier(f"uploading part {number} of checkpoint step {self.step}", self.attempts)
        while True:
            status = None
            try:
                response = session.put(url, data=_Chunks(data), timeout=(CONNECT_TIMEOUT_S, UPLOAD_READ_TIMEOUT_S))
            except requests.RequestException as exc:
                reason = f"{type(exc).__name__}: {exc}"
                if _unresolved(exc) and not self.storage_answered:
                    if retrier.elapsed() >= STORAGE_UNREACHABLE_S:
                        raise _storage_unreachable(url, exc, retrier) from exc
            else:
                self.storage_answered = True
                if response.status_code < 400 and response.headers.get("ETag"):
                    return {"part_number": number, "etag": response.headers["ETag"]}
                status = response.status_code
                reason = f"HTTP {status}: {body_detail(response, 200)}"
                if not is_transient(status):
                    raise _PartFailed(f"part {number}: {reason}")
            if not retrier.pause(reason, status=status):
                raise _PartFailed(f"part {number}: {reason}; {retrier.summary()}")

    def _wait_verified(self, resource: dict) -> dict:
        """Poll ``checkpoints/{id}/`` until the verification task completed it or recorded an error."""
        deadline = time.monotonic() + self.verify_timeout
        delay = 0.1
        while resource["state"] == "pending" and not resource.get("error"):
            if time.monotonic() > deadline:
                raise ApiError(
                    f"checkpoint {self.id} (step {self.step}) is still being verified after "
                    f"{self.verify_timeout:.0f} s; it completes on the server by itself"
                )
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
            resource = self.client.request("GET", f"checkpoints/{self.id}/")
        return resource


class _PartFailed(Exception):
    """A part could not be stored; the whole direct upload starts again."""


def _unresolved(exc: requests.RequestException) -> bool:
    """True when ``exc`` is a connection error because the URL's host name does not resolve on this machine."""
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    return isinstance(exc, requests.ConnectionError) and isinstance(reason, NameResolutionError)


def _storage_unreachable(url: str, exc: requests.ConnectionError, retrier: Retrier) -> CheckpointError:
    """The error of an upload whose presigned URLs name a host this machine cannot resolve (docs/deploy.md, "S3
    seen from outside"): it names the host and the server setting that fixes it."""
    host = urlsplit(url).netloc
    return CheckpointError(
        f"the object storage at {host}, named by the server's presigned upload URLs, cannot be reached from this "
        f"machine ({type(exc).__name__}; {retrier.tries + 1} tries in {retrier.elapsed():.0f} s). The mado server's "
        "operator sets MADO_S3_PUBLIC_ENDPOINT_URL to an S3 address this machine reaches"
    )
