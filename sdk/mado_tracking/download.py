"""Downloading a checkpoint's tar (SPEC F12): streamed to a file, SHA-256 checked, a broken download resumed.

``GET checkpoints/{id}/tar`` is read in 1 MiB chunks (``stream_tar``, also
what ``mado agent``'s one-pass restore reads) straight to
``<destination>.partial`` while a second thread hashes them (hashlib
releases the GIL), so memory stays constant. A connection that breaks, or
an answer that ends early, resumes with ``Range: bytes=<received>-`` and
``If-Range: "<sha256>"``. Only a file whose size and SHA-256 equal the
checkpoint's is renamed to ``destination``.
"""

import hashlib
import logging
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from mado_tracking import config as config_module
from mado_tracking.client import (CONNECT_TIMEOUT_S, ApiClient, Backoff, body_detail, is_transient,
                                  retry_after_seconds)
from mado_tracking.errors import ApiError, CheckpointError

logger = logging.getLogger("mado_tracking")

CHUNK = 1 << 20
ATTEMPTS = 5
READ_TIMEOUT_S = 300.0


def download_checkpoint(checkpoint_id: int, destination: str | os.PathLike, *, api_url: str | None = None,
                        api_token: str | None = None) -> Path:
    """Download complete checkpoint ``checkpoint_id``'s tar to the file ``destination``; return its path.

    ``api_url`` / ``api_token`` as in ``start_run`` (``MMT_API_URL`` /
    ``MMT_API_TOKEN``). Raises ``CheckpointError`` when the checkpoint is not
    complete or the bytes do not match its size and SHA-256, ``ApiError``
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
        raise CheckpointError(f"Checkpoint {checkpoint_id} tar mismatch: downloaded {received.size} bytes with "
                              f"SHA-256 {digest}, expected {size} bytes with {sha256}")
    os.replace(partial, destination)
    return destination


def complete_checkpoint(client: ApiClient, checkpoint_id: int) -> dict:
    """``GET checkpoints/{id}/`` (with its manifest); ``CheckpointError`` unless the checkpoint is complete."""
    resource = client.request("GET", f"checkpoints/{checkpoint_id}/", attempts=3)
    if resource.get("state") != "complete":
        raise CheckpointError(f"checkpoint {checkpoint_id} is {resource.get('state')}; only a complete one "
                              "can be downloaded")
    return resource


def stream_tar(client: ApiClient, checkpoint_id: int, *, size: int, sha256: str, attempts: int = ATTEMPTS):
    """Yield the ``size`` bytes of the checkpoint's tar in order, in chunks of up to 1 MiB (SPEC F12).

    A connection that breaks, or an answer that ends early, resumes with
    ``Range: bytes=<received>-`` and ``If-Range: "<sha256>"``; a server that
    answers 200 instead sends everything again and the bytes already yielded
    are skipped. Raises ``ApiError`` after ``attempts`` tries in a row, or
    at once for a refusal that is not transient. The bytes are not checked
    here: the caller hashes or verifies them.
    """
    url = client.url(f"checkpoints/{checkpoint_id}/tar")
    backoff = Backoff()
    received = 0
    for attempt in range(1, attempts + 1):
        reason, retry_after = None, None
        headers = {"If-Range": f'"{sha256}"', "Range": f"bytes={received}-"} if received else {}
        try:
            with client.session.get(url, headers=headers, stream=True,
                                    timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S)) as answer:
                skip = received if answer.status_code == 200 else 0  # the server sent everything again
                if answer.status_code not in (200, 206):
                    if not is_transient(answer.status_code):
                        raise ApiError(f"GET {url} -> HTTP {answer.status_code}: {body_detail(answer)}",
                                       status=answer.status_code)
                    reason, retry_after = f"HTTP {answer.status_code}", retry_after_seconds(answer)
                else:
                    for chunk in answer.iter_content(CHUNK):
                        if skip:
                            cut, skip = min(skip, len(chunk)), skip - min(skip, len(chunk))
                            chunk = chunk[cut:]
                        if chunk:
                            received += len(chunk)
                            yield chunk
        except requests.RequestException as exc:
            reason = f"{type(exc).__name__}: {exc}"
        if reason is None and received >= size:
            return
        reason = reason or f"the answer ended after {received} of {size} bytes"
        if attempt == attempts:
            raise ApiError(f"downloading checkpoint {checkpoint_id} failed {attempts} times; last: {reason}")
        delay = backoff.next_delay(retry_after)
        logger.warning("mado: downloading checkpoint %s broke (%s); resuming at byte %d in %.1f s",
                       checkpoint_id, reason, received, delay)
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
