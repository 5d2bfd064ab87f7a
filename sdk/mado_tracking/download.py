"""Downloading a checkpoint's tar (SPEC F12): streamed to a file, SHA-256 checked, a broken download resumed.

``GET checkpoints/{id}/tar`` is read in 1 MiB chunks straight to
``<destination>.partial`` while a second thread hashes them (hashlib
releases the GIL), so memory stays constant. A connection that breaks, or
an answer that ends early, resumes with ``Range: bytes=<received>-`` and
``If-Range: "<sha256>"`` (a server that answers 200 instead restarts the
file). Only a file whose size and SHA-256 equal the checkpoint's is renamed
to ``destination``.
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
    resource = client.request("GET", f"checkpoints/{checkpoint_id}/")
    if resource.get("state") != "complete":
        raise CheckpointError(f"checkpoint {checkpoint_id} is {resource.get('state')}; only a complete one "
                              "can be downloaded")
    size, sha256 = resource["tar_size"], resource["tar_sha256"]
    partial = destination.with_name(destination.name + ".partial")
    received = _Received(partial)
    url = client.url(f"checkpoints/{checkpoint_id}/tar")
    backoff = Backoff()
    try:
        for attempt in range(1, attempts + 1):
            reason, retry_after = _fetch_rest(client.session, url, sha256, received)
            if reason is None and received.size == size:
                break
            reason = reason or f"the answer ended after {received.size} of {size} bytes"
            if attempt == attempts:
                raise ApiError(f"downloading checkpoint {checkpoint_id} failed {attempts} times; last: {reason}")
            delay = backoff.next_delay(retry_after)
            logger.warning("mado: downloading checkpoint %s broke (%s); resuming at byte %d in %.1f s",
                           checkpoint_id, reason, received.size, delay)
            time.sleep(delay)
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


def _fetch_rest(session: requests.Session, url: str, sha256: str, received: "_Received"):
    """One GET of the bytes not received yet; ``(None, None)`` when the answer ended normally, else (reason, retry_after)."""
    headers = {"If-Range": f'"{sha256}"', "Range": f"bytes={received.size}-"} if received.size else {}
    try:
        with session.get(url, headers=headers, stream=True, timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S)) as answer:
            if answer.status_code == 200 and received.size:
                received.restart()  # the server sent everything again
            elif answer.status_code not in (200, 206):
                if is_transient(answer.status_code):
                    return f"HTTP {answer.status_code}", retry_after_seconds(answer)
                raise ApiError(f"GET {url} -> HTTP {answer.status_code}: {body_detail(answer)}",
                               status=answer.status_code)
            for chunk in answer.iter_content(CHUNK):
                received.write(chunk)
    except requests.RequestException as exc:
        return f"{type(exc).__name__}: {exc}", None
    return None, None


class _Received:
    """The partial file and its running SHA-256, hashed on a second thread (at most 4 chunks ahead)."""

    def __init__(self, path: Path):
        self._path = path
        self._handle = open(path, "wb")
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

    def restart(self) -> None:
        self._wait()
        self._handle.seek(0)
        self._handle.truncate()
        self._digest = hashlib.sha256()
        self.size = 0

    def _wait(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> str:
        if not self._handle.closed:
            self._wait()
            self._handle.close()
            self._hasher.shutdown()
        return self._digest.hexdigest()
