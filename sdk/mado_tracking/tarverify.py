"""A checkpoint tar checked against its manifest and declaration in the pass that reads it
(docs/design/checkpoints.md#a-checkpoint; docs/design/worker.md#verify, #refusal).

``CheckpointVerifier`` runs the bytes through ``tarformat.TarReader`` (the
one format check), hashes every file and the whole tar, and compares them
with the manifest: the server while an upload arrives, the worker and
``mado agent`` while a restore downloads. A ``writer`` (the restores'
staging directory) receives each file's bytes as they are checked, so a
restore reads and writes every byte once.
"""

import hashlib
import json
from collections import deque
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mado_tracking.hashing import Done, Lanes, hash_threads
from mado_tracking.tarformat import Limits, ManifestMismatch, Member, TarReader

LANE_MIN_BYTES = 1 << 20  # a smaller file is hashed on the caller's thread: handing it over costs more

__all__ = ["CheckpointVerifier", "ManifestFile", "ManifestMismatch", "compare_members", "manifest_digest"]


@dataclass(frozen=True)
class ManifestFile:
    """One file of a checkpoint: relative POSIX ``path``, ``size`` in bytes, hex ``sha256``."""

    path: str
    size: int
    sha256: str


def manifest_digest(manifest: Iterable[ManifestFile]) -> str:
    """SHA-256 (hex) of the canonical manifest JSON: ``[{"path","sha256","size"}…]`` sorted by path, keys sorted,
    separators ``,`` and ``:``, UTF-8, no trailing newline. What ``complete`` accepts as ``manifest_sha256``
    and ``resume-checkpoint.json`` records as ``manifestSha256``."""
    entries = [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in sorted(manifest, key=lambda f: f.path)]
    canonical = json.dumps(entries, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class CheckpointVerifier:
    """``feed(chunk)`` the tar's bytes, then ``finish()``; ``ManifestMismatch`` once a difference shows.

    ``manifest`` lists every file the tar must hold, or None when it arrives
    only after the bytes (then ``compare_members(verifier.members, manifest)``). ``tar_size`` (bytes)
    and ``tar_sha256`` (hex) are the declaration, or None to only compute
    them. ``writer`` (optional) gets ``begin(Member)``, ``data(view)`` and
    ``end()`` after each member's checks. After ``finish()``: ``size``,
    ``sha256`` and ``members`` (path → ``ManifestFile``, files only).

    ``threads`` (default ``hashing.hash_threads()``) hash at once
    (docs/design/checkpoints.md#hash-threads): with 1 everything runs on the
    caller's thread; with more, the tar's digest has a thread of its own, the
    files' digests share the others (a file of 1 MiB or more on one lane,
    smaller ones on the caller's thread), and the writer gets a thread too.
    A file's SHA-256 is then compared when its lane has caught up, at the
    latest in ``finish()``; when the format check refuses a later member
    first, an earlier file's difference is still the one raised. The
    chunks fed must not change afterwards (bytes, not a reused buffer).
    """

    def __init__(
        self,
        manifest: list[ManifestFile] | None = None,
        *,
        tar_size: int | None = None,
        tar_sha256: str | None = None,
        limits: Limits = Limits(),
        writer=None,
        threads: int | None = None,
    ):
        threads = hash_threads() if threads is None else threads
        self._expected = None if manifest is None else {entry.path: entry for entry in manifest}
        self._declared_size = tar_size
        self._declared_sha = tar_sha256
        self._writer = writer
        self._reader = TarReader(self, limits=limits)
        self._lanes = Lanes(threads if threads > 1 else 0)
        self._io = Lanes(1 if threads > 1 and writer is not None else 0, name="mado-extract")
        self._tar_hash = hashlib.sha256()
        self._files: deque = deque()  # (member, future of the hex digest), in member order, not yet compared
        self._file_count = 0
        self.members: dict[str, ManifestFile] = {}
        self.size = 0
        self.sha256 = ""
        self._member: Member | None = None
        self._digest = None
        self._lane: int | None = None

    def feed(self, chunk) -> None:
        """Consume the next bytes of the tar."""
        if not chunk:
            return
        self.size += len(chunk)
        if self._declared_size is not None and self.size > self._declared_size:
            raise ManifestMismatch("size", f"the tar is longer than the declared {self._declared_size} bytes")
        self._lanes.submit(0, self._tar_hash.update, chunk)
        self._checked(self._reader.feed, chunk)

    def finish(self) -> None:
        """Check the end of the archive, every file's SHA-256, the missing files and the declared size and SHA-256."""
        self._checked(self._reader.finish)
        self._lanes.wait()
        self._io.wait()
        self._compare_files(wait=True)
        if self._expected is not None:
            _compare_missing(self.members, self._expected)
        self.sha256 = self._tar_hash.hexdigest()
        self.close()
        if self._declared_size is not None and self.size != self._declared_size:
            raise ManifestMismatch("size", f"the tar is {self.size} bytes, {self._declared_size} were declared")
        if self._declared_sha is not None and self.sha256 != self._declared_sha:
            raise ManifestMismatch("sha256", f"the tar's SHA-256 is {self.sha256}, {self._declared_sha} was declared")

    def close(self) -> None:
        """Stop the helper threads (after a failure; ``finish`` does it on success)."""
        self._lanes.close()
        self._io.close()

    def _checked(self, step, *args) -> None:
        try:
            step(*args)
        except ManifestMismatch:
            self._lanes.wait()
            self._compare_files(wait=True)  # an earlier file that differs is named first
            raise

    def _compare_files(self, *, wait: bool) -> None:
        while self._files and (wait or self._files[0][1].done()):
            member, digest = self._files.popleft()
            found = ManifestFile(member.path, member.size, digest.result())
            if self._expected is not None:
                _compare_sha(found, self._expected)
            self.members[member.path] = found

    # --- the reader's sink ---

    def begin(self, member: Member) -> None:
        """A member's header passed the format: compare its size with the manifest, start its hash."""
        if not member.is_dir:
            if self._expected is not None:
                _compare_size(member.path, member.size, self._expected)
            self._digest = hashlib.sha256()
            self._file_count += 1
            big = self._lanes.count > 1 and member.size >= LANE_MIN_BYTES
            self._lane = 1 + self._file_count % (self._lanes.count - 1) if big else None
        self._member = member
        if self._writer is not None:
            self._io.submit(0, self._writer.begin, member)

    def data(self, view) -> None:
        """The next bytes of the current file (a memoryview): hashed, then handed to the writer."""
        if self._lane is None:
            self._digest.update(view)
        else:
            self._lanes.submit(self._lane, self._digest.update, view)
        if self._writer is not None:
            self._io.submit(0, self._writer.data, view)

    def end(self) -> None:
        """The current member ended: its SHA-256 is compared with the manifest once computed."""
        member = self._member
        if not member.is_dir:
            if self._lane is None:
                self._files.append((member, Done(self._digest.hexdigest())))
            else:
                self._files.append((member, self._lanes.submit(self._lane, self._digest.hexdigest)))
            self._compare_files(wait=False)
        if self._writer is not None:
            self._io.submit(0, self._writer.end)


def compare_members(found: dict[str, ManifestFile], manifest: list[ManifestFile]) -> None:
    """Compare the files a verifier found (``members``) with a manifest that arrived after the bytes.

    Raises ``ManifestMismatch`` (``manifest`` for an extra or missing file, ``size``, ``sha256``).
    """
    expected = {entry.path: entry for entry in manifest}
    for member in found.values():
        _compare_size(member.path, member.size, expected)
        _compare_sha(member, expected)
    _compare_missing(found, expected)


def _compare_size(path: str, size: int, expected: dict[str, ManifestFile]) -> None:
    entry = expected.get(path)
    if entry is None:
        raise ManifestMismatch("manifest", f"extra file {path!r} is in the tar but not in the manifest")
    if size != entry.size:
        raise ManifestMismatch("size", f"{path!r} is {size} bytes in the tar, {entry.size} in the manifest")


def _compare_sha(member: ManifestFile, expected: dict[str, ManifestFile]) -> None:
    if member.sha256 != expected[member.path].sha256:
        raise ManifestMismatch(
            "sha256", f"{member.path!r} has SHA-256 {member.sha256}, the manifest says {expected[member.path].sha256}"
        )


def _compare_missing(found: dict[str, ManifestFile], expected: dict[str, ManifestFile]) -> None:
    if len(found) != len(expected) or not found.keys() <= expected.keys():
        missing = sorted(set(expected) - set(found))
        raise ManifestMismatch("manifest", f"missing from the tar: {', '.join(repr(p) for p in missing[:5])}")


class ThreadedSha256:
    """SHA-256 of the whole tar on a helper thread, beside the files' hashes on the caller's.

    hashlib releases the GIL on large updates, so the two passes over every
    byte use two cores. Updates stay in order (one worker); at most ``ahead``
    chunks wait, so memory stays bounded.
    """

    def __init__(self, ahead: int = 8):
        self._hash = hashlib.sha256()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mado-tar-sha256")
        self._pending: deque = deque()
        self._ahead = ahead

    def update(self, chunk) -> None:
        self._pending.append(self._executor.submit(self._hash.update, chunk))
        if len(self._pending) > self._ahead:
            self._pending.popleft().result()

    def hexdigest(self) -> str:
        while self._pending:
            self._pending.popleft().result()
        self.close()
        return self._hash.hexdigest()

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
