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

from mado_tracking.tarformat import Limits, ManifestMismatch, Member, TarReader

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
    """``feed(chunk)`` the tar's bytes, then ``finish()``; ``ManifestMismatch`` as soon as a difference shows.

    ``manifest`` lists every file the tar must hold, or None when it arrives
    only after the bytes (then ``compare_members(verifier.members, manifest)``). ``tar_size`` (bytes)
    and ``tar_sha256`` (hex) are the declaration, or None to only compute
    them. ``writer`` (optional) gets ``begin(Member)``, ``data(view)`` and
    ``end()`` after each member's checks. After ``finish()``: ``size``,
    ``sha256`` and ``members`` (path → ``ManifestFile``, files only).
    """

    def __init__(
        self,
        manifest: list[ManifestFile] | None = None,
        *,
        tar_size: int | None = None,
        tar_sha256: str | None = None,
        limits: Limits = Limits(),
        writer=None,
    ):
        self._expected = None if manifest is None else {entry.path: entry for entry in manifest}
        self._declared_size = tar_size
        self._declared_sha = tar_sha256
        self._writer = writer
        self._reader = TarReader(self, limits=limits)
        self._tar_hash = ThreadedSha256()
        self.members: dict[str, ManifestFile] = {}
        self.size = 0
        self.sha256 = ""
        self._member: Member | None = None
        self._digest = None

    def feed(self, chunk) -> None:
        """Consume the next bytes of the tar."""
        if not chunk:
            return
        self.size += len(chunk)
        if self._declared_size is not None and self.size > self._declared_size:
            raise ManifestMismatch("size", f"the tar is longer than the declared {self._declared_size} bytes")
        self._tar_hash.update(chunk)
        self._reader.feed(chunk)

    def finish(self) -> None:
        """Check the end of the archive, the missing files and the declared size and SHA-256."""
        self._reader.finish()
        if self._expected is not None:
            _compare_missing(self.members, self._expected)
        self.sha256 = self._tar_hash.hexdigest()
        if self._declared_size is not None and self.size != self._declared_size:
            raise ManifestMismatch("size", f"the tar is {self.size} bytes, {self._declared_size} were declared")
        if self._declared_sha is not None and self.sha256 != self._declared_sha:
            raise ManifestMismatch("sha256", f"the tar's SHA-256 is {self.sha256}, {self._declared_sha} was declared")

    def close(self) -> None:
        """Stop the helper thread (after a failure; ``finish`` does it on success)."""
        self._tar_hash.close()

    # --- the reader's sink ---

    def begin(self, member: Member) -> None:
        """A member's header passed the format: compare its size with the manifest, start its hash."""
        if not member.is_dir:
            if self._expected is not None:
                _compare_size(member.path, member.size, self._expected)
            self._digest = hashlib.sha256()
        self._member = member
        if self._writer is not None:
            self._writer.begin(member)

    def data(self, view) -> None:
        """The next bytes of the current file (a memoryview): hashed, then handed to the writer."""
        self._digest.update(view)
        if self._writer is not None:
            self._writer.data(view)

    def end(self) -> None:
        """The current member ended: compare the file's SHA-256 with the manifest and record it."""
        member = self._member
        if not member.is_dir:
            found = ManifestFile(member.path, member.size, self._digest.hexdigest())
            if self._expected is not None:
                _compare_sha(found, self._expected)
            self.members[member.path] = found
        if self._writer is not None:
            self._writer.end()


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
