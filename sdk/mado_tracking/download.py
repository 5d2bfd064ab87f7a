"""Downloading a checkpoint's tar (docs/design/worker.md#fetch): streamed to a file, SHA-256 checked, a broken download
resumed.

``GET checkpoints/{id}/tar`` is read in 1 MiB chunks (``stream_tar``, also
what ``mado agent``'s one-pass restore reads) straight to
``<destination>.partial`` while a second thread hashes them (hashlib
releases the GIL), so memory stays constant. A tar of more than one 16 MiB
part comes as parallel ranged GETs (``MMT_DOWNLOAD_PARALLEL``, 4 at a time
from another machine) when the server honours ``Range``, as the worker reads S3. A connection that
breaks, or an answer that ends early, resumes with ``Range: bytes=<received>-``
and ``If-Range: "<sha256>"``. Only a file whose size and SHA-256 equal the
checkpoint's is renamed to ``destination``.
"""

import contextlib
import hashlib
import itertools
import logging
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote, urlsplit

import requests

from mado_tracking import config as config_module
from mado_tracking.client import CONNECT_TIMEOUT_S, ApiClient, Backoff, body_detail, is_transient, retry_after_seconds
from mado_tracking.errors import ApiError, CheckpointError

logger = logging.getLogger("mado_tracking")

CHUNK = 1 << 20
ATTEMPTS = 5
PART_BYTES = 16 << 20  # one ranged GET of a parallel download
ENV_PARALLEL = "MMT_DOWNLOAD_PARALLEL"
DEFAULT_PARALLEL = 4
READ_TIMEOUT_S = 300.0


def download_checkpoint(
    checkpoint_id: int, destination: str | os.PathLike, *, api_url: str | None = None, api_token: str | None = None
) -> Path:
    """Download complete checkpoint ``checkpoint_id``'s tar to the file ``destination``; return its path.

    ``api_url`` / ``api_token`` as in ``start_run`` (``MMT_API_URL`` /
    ``MMT_API_TOKEN``). Raises ``CheckpointError`` when the checkpoint is not
    complete, has no tar (saved through MLflow: restore it with
    ``extract.restore_checkpoint`` instead) or the bytes do not match its size and SHA-256, ``ApiError``
    when the server refuses (404 for a checkpoint you cannot see) or stays
    unreachable through the retries, ``ConfigError`` for missing settings.
    """
    config = config_module.resolve(api_url=api_url, api_token=api_token, require_project=False)
    client = ApiClient(config)
    try:
        return fetch_tar(client, checkpoint_id, Path(destination))
    finally:
        client.close()


def fetch_tar(client: ApiClient, checkpoint_id: int, destination: Path, *, attempts: int = ATTEMPTS) -> Path:
    """``download_checkpoint`` with an open ``ApiClient`` (see the module docstring)."""
    resource = complete_checkpoint(client, checkpoint_id)
    if resource.get("layout") == "files":
        raise CheckpointError(
            f"checkpoint {checkpoint_id} is made of separate files (saved through MLflow), not one tar: restore it "
            f"with `mado checkpoint restore {checkpoint_id} --into DIR` (or run.resume_checkpoint() in its run)"
        )
    size, sha256 = resource["tar_size"], resource["tar_sha256"]
    partial = destination.with_name(destination.name + ".partial")
    received = _Received(partial)
    try:
        for chunk in stream_tar(client, checkpoint_id, size=size, sha256=sha256, attempts=attempts):
            received.write(chunk)
        digest = received.close()
    except BaseException:
        received.close()
        partial.unlink(missing_ok=True)
        raise
    if (received.size, digest) != (size, sha256):
        partial.unlink(missing_ok=True)
        raise CheckpointError(
            f"Checkpoint {checkpoint_id} tar mismatch: downloaded {received.size} bytes with "
            f"SHA-256 {digest}, expected {size} bytes with {sha256}"
        )
    os.replace(partial, destination)
    return destination


def complete_checkpoint(client: ApiClient, checkpoint_id: int) -> dict:
    """``GET checkpoints/{id}/`` (with its manifest); ``CheckpointError`` unless the checkpoint is complete."""
    resource = client.request("GET", f"checkpoints/{checkpoint_id}/", attempts=3)
    state = resource.get("state")
    if state == "corrupt":  # its stored bytes were found missing or altered (docs/design/checkpoints.md#damage)
        raise CheckpointError(f"checkpoint {checkpoint_id} is corrupt: {resource.get('error') or 'no reason recorded'}")
    if state != "complete":
        raise CheckpointError(f"checkpoint {checkpoint_id} is {state}; only a complete one can be downloaded")
    return resource


def stream_tar(
    client: ApiClient,
    checkpoint_id: int,
    *,
    size: int,
    sha256: str,
    attempts: int = ATTEMPTS,
    parallel: int | None = None,
):
    """Yield the ``size`` bytes of the checkpoint's tar (``GET checkpoints/{id}/tar``) in order, in chunks of up to
    1 MiB (docs/design/worker.md#fetch); see ``stream_download``."""
    url = client.url(f"checkpoints/{checkpoint_id}/tar")
    with _corrupt_named():
        yield from stream_download(
            client, url, f"checkpoint {checkpoint_id}", size=size, sha256=sha256, attempts=attempts, parallel=parallel
        )


def stream_file(client: ApiClient, checkpoint_id: int, path: str, *, size: int, sha256: str, attempts: int = ATTEMPTS):
    """Yield the ``size`` bytes of file ``path`` (a manifest path) of a checkpoint saved through MLflow
    (``GET checkpoints/{id}/files/<path>``), in order, in chunks of up to 1 MiB; see ``stream_download``."""
    url = client.url(f"checkpoints/{checkpoint_id}/files/{quote(path, safe='/')}")
    with _corrupt_named():
        yield from stream_download(
            client, url, f"checkpoint {checkpoint_id} file {path!r}", size=size, sha256=sha256, attempts=attempts
        )


def _refusal(answer: requests.Response, url: str) -> ApiError:
    """The ``ApiError`` of a download the server refused, with the ``error`` code of its JSON body when it has one."""
    try:
        payload = answer.json()
    except ValueError:
        payload = None
    code = payload.get("error") if isinstance(payload, dict) else None
    detail = body_detail(answer)
    return ApiError(
        f"GET {url} -> HTTP {answer.status_code}: {detail}", status=answer.status_code, code=code, detail=detail
    )


@contextlib.contextmanager
def _corrupt_named():
    """The server's 410 ``checkpoint_corrupt`` (its stored bytes are missing or differ from what was verified,
    docs/design/checkpoints.md#damage) as a ``CheckpointError`` with the server's reason; other errors unchanged."""
    try:
        yield
    except ApiError as error:
        if error.code == "checkpoint_corrupt":
            raise CheckpointError(error.detail or str(error)) from None
        raise


def stream_download(
    client: ApiClient,
    url: str,
    label: str,
    *,
    size: int,
    sha256: str,
    attempts: int = ATTEMPTS,
    parallel: int | None = None,
):
    """Yield the ``size`` bytes that ``GET url`` answers, in order, in chunks of up to 1 MiB
    (docs/design/worker.md#fetch). ``label`` names the download in warnings and errors.

    A body larger than one part (``PART_BYTES``, 16 MiB) is fetched as ranged
    GETs of one part each, ``parallel`` at a time (default
    ``download_parallel(url)``: 4, or 1 from this machine; 1: one GET of
    everything), yielded in order; at most ``parallel`` + 1 parts are held
    in memory. The first part
    tells whether the server honours ``Range`` (206): one that answers 200
    sends everything in that one answer, read in order. A connection that
    breaks, or an answer that ends early, resumes with ``Range:
    bytes=<received>-<end>`` and ``If-Range: "<sha256>"``; a server that answers
    200 instead sends everything again and the bytes already yielded are
    skipped. Raises ``ApiError`` after ``attempts`` tries in a row of one
    part, or at once for a refusal that is not transient. The bytes are not
    checked here: the caller hashes or verifies them.
    """
    parallel = download_parallel(url) if parallel is None else parallel
    if parallel < 2 or size <= PART_BYTES:
        yield from _Range(client, url, label, 0, size, size, sha256, attempts).chunks()
        return
    first = _Range(client, url, label, 0, PART_BYTES, size, sha256, attempts)
    yield from first.chunks()
    if not first.partial:  # no ranges here: read on from one answer
        yield from _Range(client, url, label, PART_BYTES, size, size, sha256, attempts).chunks()
        return
    starts = iter(range(PART_BYTES, size, PART_BYTES))
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="mado-download-part") as pool:
        pending: deque = deque()
        try:
            for offset in itertools.islice(starts, parallel):
                pending.append(pool.submit(_fetch_part, client, url, label, offset, size, sha256, attempts))
            while pending:
                part = pending.popleft().result()
                for offset in itertools.islice(starts, 1):
                    pending.append(pool.submit(_fetch_part, client, url, label, offset, size, sha256, attempts))
                yield from part
        finally:
            for future in pending:
                future.cancel()


def download_parallel(url: str = "") -> int:
    """``MMT_DOWNLOAD_PARALLEL`` as an int >= 1; ``ValueError`` naming the variable otherwise.

    Unset: 4 (``DEFAULT_PARALLEL``), or 1 when ``url``'s host is this machine
    (``localhost``, ``127.0.0.0/8``, ``::1``): parallel connections help a
    download that one TCP stream over a network holds back, while over
    loopback one stream already runs at memory speed and each extra GET only
    costs the server a request's CPU (docs/deploy.md, "Measured").
    """
    raw = os.environ.get(ENV_PARALLEL, "").strip()
    if not raw:
        host = urlsplit(url).hostname or ""
        loopback = host == "localhost" or host.startswith("127.") or host == "::1"
        return 1 if loopback else DEFAULT_PARALLEL
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{ENV_PARALLEL} must be a whole number >= 1 (ranged GETs at once), got {raw!r}")
    return int(raw)


def _fetch_part(
    client: ApiClient, url: str, label: str, offset: int, size: int, sha256: str, attempts: int
) -> list[bytes]:
    """One part's bytes (a ranged GET, resumed after a break), run on a download thread."""
    end = min(offset + PART_BYTES, size)
    return list(_Range(client, url, label, offset, end, size, sha256, attempts).chunks())


class _Range:
    """Bytes ``start`` … ``end - 1`` of the ``total``-byte body, resumed after a break; ``partial``: the server
    answered 206 (a plain GET when that is the whole body)."""

    def __init__(
        self,
        client: ApiClient,
        url: str,
        label: str,
        start: int,
        end: int,
        total: int,
        sha256: str,
        attempts: int,
    ):
        self.client, self.url, self.label = client, url, label
        self.start, self.end, self.total, self.sha256, self.attempts = start, end, total, sha256, attempts
        self.partial = False

    def chunks(self):
        backoff = Backoff()
        position = self.start  # the next byte to yield
        for attempt in range(1, self.attempts + 1):
            reason, retry_after = None, None
            last = "" if self.end == self.total else str(self.end - 1)
            headers = (
                {}
                if (position, self.end) == (0, self.total)
                else {"If-Range": f'"{self.sha256}"', "Range": f"bytes={position}-{last}"}
            )
            try:
                with self.client.session.get(
                    self.url, headers=headers, stream=True, timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
                ) as answer:
                    if answer.status_code not in (200, 206):
                        if not is_transient(answer.status_code):
                            raise _refusal(answer, self.url)
                        reason, retry_after = f"HTTP {answer.status_code}", retry_after_seconds(answer)
                    else:
                        self.partial = answer.status_code == 206
                        at = position if self.partial else 0  # the offset of the answer's next byte
                        for chunk in answer.iter_content(CHUNK):
                            cut = max(position - at, 0)
                            at += len(chunk)
                            chunk = chunk[cut : len(chunk) - max(at - self.end, 0)]
                            if chunk:
                                position += len(chunk)
                                yield chunk
                            if position >= self.end:
                                break
            except requests.RequestException as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if reason is None and position >= self.end:
                return
            reason = reason or f"the answer ended after byte {position} of {self.end}"
            if attempt == self.attempts:
                raise ApiError(f"downloading {self.label} failed {self.attempts} times; last: {reason}")
            delay = backoff.next_delay(retry_after)
            logger.warning(
                "mado: downloading %s broke (%s); resuming at byte %d in %.1f s",
                self.label,
                reason,
                position,
                delay,
            )
            time.sleep(delay)


class _Received:
    """The partial file and its running SHA-256, hashed on a second thread (at most 4 chunks ahead)."""

    def __init__(self, path: Path):
        self._handle = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mado-download-sha256")
        self._digest = hashlib.sha256()
        self._pending: deque = deque()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self._handle.write(chunk)
        self._pending.append(self._hasher.submit(self._digest.update, chunk))
        if len(self._pending) > 4:
            self._pending.popleft().result()
        self.size += len(chunk)

    def close(self) -> str:
        if not self._handle.closed:
            while self._pending:
                self._pending.popleft().result()
            self._handle.close()
            self._hasher.shutdown()
        return self._digest.hexdigest()
