"""A checkpoint directory as a tar stream, hashed in the same pass that sends it
(docs/design/checkpoints.md#a-checkpoint, #save-and-restore).

``CheckpointTar(directory)`` walks the directory once and refuses, before any
byte is sent, a symbolic link, an empty directory, or anything that is not a
regular file (``CheckpointError`` naming the path). It then behaves as a
iterable of known length (``len()``), so an HTTP client sends it with a
``Content-Length`` and constant memory. Each file is read once: every chunk
read feeds the file's SHA-256 and is yielded as the next tar bytes, so no
byte is read or hashed twice on the client. A file of 1 MiB or more is
hashed on a thread beside the one sending (``hashing.hash_threads()`` - 1
threads, docs/design/checkpoints.md#hash-threads), so hashing and sending
overlap. The whole tar's SHA-256 is not
needed for an upload (the server computes it while it checks every header
and file); with ``tar_hash=True`` (an offline save records it) it runs
beside the files' hashes on a second thread (hashlib releases the GIL).
After the last byte, ``manifest`` lists ``{"path", "size", "sha256"}`` per
file and ``sha256`` is the tar's digest (None without ``tar_hash``).

What the writer emits, exactly (docs/checkpoint-format.md):

- one member per regular file, in sorted order of the UTF-8 relative POSIX
  path; no directory members (every directory holds a file, so each one is
  implied by the paths below it), no links, devices or other types;
- each member is a POSIX.1-2001 (PAX) ustar header block: magic
  ``ustar\0`` version ``00``, type ``0``, mode ``0444``, uid/gid 0, empty
  owner names, mtime 0, numbers in octal, empty prefix field. A path longer
  than 100 bytes or not ASCII, and a size of 8 GiB or more, get a PAX
  extended header (type ``x``, named ``././@PaxHeader``, records ``path``
  in UTF-8 / ``size`` in decimal) right before the member, whose ustar
  fields then hold a truncated name / a NUL-filled size; no GNU extensions (``L``/``K`` members, base-256
  numbers) are ever written;
- file data padded with zeros to a multiple of 512 bytes, and two zero blocks
  at the end (no further padding to a record size).

The tar is deterministic: the same directory always gives the same bytes, so
a retried upload is idempotent.
"""

import hashlib
import os
import stat
import tarfile
from pathlib import Path

from mado_tracking.errors import CheckpointError
from mado_tracking.hashing import Done, Lanes, hash_threads
from mado_tracking.tarformat import Limits, ManifestMismatch, check_path
from mado_tracking.tarverify import LANE_MIN_BYTES, ThreadedSha256

__all__ = ["CheckpointError", "CheckpointTar", "scan"]

BLOCK = 512
END = b"\x00" * (2 * BLOCK)


def scan(directory: str | os.PathLike) -> list[tuple[str, Path, int]]:
    """Walk ``directory`` once; return ``(relative POSIX path, absolute path, size in bytes)`` sorted by path.

    Raises ``CheckpointError`` for a missing directory, a symbolic link
    anywhere, an empty directory (the root or below), a non-regular file or
    a path the checkpoint format refuses (``tarformat.check_path`` under the
    ``MADO_TAR_MAX_*`` limits: too long, a Windows device name, …; docs/design/worker.md#verify),
    so the server's refusal shows before any byte is sent.
    """
    root = Path(directory)
    if root.is_symlink():
        raise CheckpointError(f"{root}: is a symbolic link; checkpoints hold regular files only")
    if not root.is_dir():
        raise CheckpointError(f"{root}: is not a directory")
    files: list[tuple[str, Path, int]] = []
    limits = Limits.from_env()
    for current, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(current)
        if not dirnames and not filenames:
            raise CheckpointError(f"{here}: empty directory; remove it or put a file in it")
        level = len(here.relative_to(root).parts) + 1
        if level > limits.depth:  # refused before os.walk goes deeper (it recurses once per level)
            raise CheckpointError(
                f"{here / (dirnames + filenames)[0]}: cannot be in a checkpoint: "
                f"path of {level} levels is deeper than {limits.depth} levels"
            )
        for name in dirnames + filenames:
            path = here / name
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                raise CheckpointError(f"{path}: is a symbolic link; checkpoints hold regular files only")
            if name in filenames:
                if not stat.S_ISREG(info.st_mode):
                    raise CheckpointError(f"{path}: is not a regular file")
                files.append((path.relative_to(root).as_posix(), path, info.st_size))
    for relative, path, _ in files:
        try:
            check_path(relative.encode("utf-8", "surrogateescape"), limits)
        except ManifestMismatch as exc:
            raise CheckpointError(f"{path}: cannot be in a checkpoint: {exc.detail}") from None
    files.sort()
    return files


def _header(relative: str, size: int) -> bytes:
    info = tarfile.TarInfo(relative)
    info.size = size
    info.mode = 0o444
    info.mtime = 0
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")


class CheckpointTar:
    """An iterable of the tar's bytes with a known ``len()``; see the module docstring.

    Iterate it once (an HTTP client sends it as the request body); to retry,
    build a new one. With ``tar_hash`` the tar's SHA-256 is computed on a
    second thread so the two hashes of every byte (file and tar) use two
    cores (hashlib releases the GIL); at most ``max_ahead`` chunks of
    ``chunk_size`` bytes are held.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        chunk_size: int = 1 << 20,
        max_ahead: int = 4,
        on_bytes=None,
        tar_hash: bool = False,
    ):
        self.files = scan(directory)
        self._headers = [_header(rel, size) for rel, _, size in self.files]
        self.total_bytes = sum(size for _, _, size in self.files)
        self._length = sum(len(h) + size + (-size % BLOCK) for h, (_, _, size) in zip(self._headers, self.files))
        self._length += len(END)
        self._chunk = chunk_size
        self._max_ahead = max_ahead
        self.on_bytes = on_bytes  # called with each chunk's length as it is sent (a progress bar)
        self.manifest: list[dict] = []
        self.sha256: str | None = None
        self._tar_hash = tar_hash

    def __len__(self) -> int:
        return self._length

    def __iter__(self):
        hasher = ThreadedSha256(ahead=self._max_ahead) if self._tar_hash else None
        try:
            for part in self._parts():
                if hasher is not None:
                    hasher.update(part)
                if self.on_bytes:
                    self.on_bytes(len(part))
                yield part
            if hasher is not None:
                self.sha256 = hasher.hexdigest()
        finally:
            if hasher is not None:
                hasher.close()

    def _parts(self):
        # Each file's SHA-256 runs on a lane of its own while the sending thread goes on with the next
        # chunk (hashlib releases the GIL), on up to hash_threads() - 1 threads beside the sender.
        threads = hash_threads()
        lanes = Lanes(threads - 1 if threads > 1 else 0, ahead=self._max_ahead * 4)
        digests = []
        try:
            for index, (header, (relative, path, size)) in enumerate(zip(self._headers, self.files)):
                yield header
                digest = hashlib.sha256()
                hand_over = lanes.count and size >= LANE_MIN_BYTES  # handing a small file over costs more
                read = 0
                with open(path, "rb") as handle:
                    while read < size:
                        data = handle.read(min(self._chunk, size - read))
                        if not data:
                            raise CheckpointError(f"{path}: shrank while it was being saved")
                        if hand_over:
                            lanes.submit(index, digest.update, data)
                        else:
                            digest.update(data)
                        read += len(data)
                        yield data
                    if handle.read(1):
                        raise CheckpointError(f"{path}: grew while it was being saved")
                digests.append(
                    (relative, size, lanes.submit(index, digest.hexdigest) if hand_over else Done(digest.hexdigest()))
                )
                if size % BLOCK:
                    yield b"\x00" * (BLOCK - size % BLOCK)
            lanes.wait()
            self.manifest.extend(
                {"path": relative, "size": size, "sha256": found.result()} for relative, size, found in digests
            )
            yield END
        finally:
            lanes.close()
