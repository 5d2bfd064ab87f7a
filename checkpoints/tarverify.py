"""Streaming check of a checkpoint tar against its manifest (SPEC F1, F13, F15).

``TarVerifier`` is fed the tar's bytes in chunks as they arrive (upload or
download) and never holds more than one 512-byte header: it hashes each
member's content, the whole tar, and compares both to what was declared.
Any difference raises ``ManifestMismatch`` naming what differed; the callers
turn it into ``Checkpoint <id> <what> mismatch: <detail>``.

Accepted members: regular files, PAX extended headers (``x``) and GNU long
names (``L``) that describe the next file. Refused: directories, symbolic or
hard links, devices, FIFOs, global PAX headers, absolute paths, ``..``,
non-normalised paths, duplicates, files missing from or absent in the
manifest, a size or SHA-256 different from the manifest's, a bad header
checksum, a truncated archive and non-zero bytes after its end.
"""

import hashlib
import posixpath
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

BLOCK = 512
_REGULAR = (b"0", b"\x00")
_KIND = {b"1": "hard link", b"2": "symbolic link", b"3": "character device", b"4": "block device",
         b"5": "directory", b"6": "FIFO", b"7": "contiguous file", b"g": "global PAX header",
         b"K": "GNU long link name"}


class ManifestMismatch(Exception):
    """The tar differs from its manifest or declaration. ``what`` is one of
    ``tar`` (not a valid tar), ``path``, ``manifest`` (extra / missing file),
    ``size`` or ``sha256``; ``detail`` says exactly what differed."""

    def __init__(self, what: str, detail: str):
        super().__init__(f"{what} mismatch: {detail}")
        self.what = what
        self.detail = detail


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size: int
    sha256: str


def check_member_path(path: str) -> None:
    """Raise ``ManifestMismatch('path', …)`` unless ``path`` is a safe, normalised relative POSIX path."""
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        raise ManifestMismatch("path", f"{path!r} is empty, absolute or contains a backslash or NUL")
    parts = path.split("/")
    if ".." in parts or "." in parts or "" in parts or posixpath.normpath(path) != path:
        raise ManifestMismatch("path", f"{path!r} is not a normalised relative path (no '..', '.', '//')")


def _octal(field: bytes, name: str) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256 for values that do not fit in octal
        value = int.from_bytes(field[1:], "big")
        return value
    text = field.split(b"\x00", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise ManifestMismatch("tar", f"header field {name} is not a number: {text!r}") from None


def _parse_pax(data: bytes) -> dict[str, str]:
    records, pos = {}, 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError:
            raise ManifestMismatch("tar", "malformed PAX header") from None
        if length <= 0:
            raise ManifestMismatch("tar", "malformed PAX header")
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


class TarVerifier:
    """Feed a tar's bytes with ``feed(chunk)``; ``finish()`` checks the end and the totals.

    ``manifest`` lists every file the tar must hold, or is None when it is only
    known after the upload (the SDK hashes files in the same pass that sends
    them): then call ``check_manifest`` once it arrives. ``tar_size`` (bytes)
    and ``tar_sha256`` (hex) are the client's declaration, or None to only
    compute them. After ``finish()``, ``size`` and ``sha256`` hold what was
    received and ``members`` every file found (path → ``ManifestFile``).
    """

    def __init__(
        self, manifest: list[ManifestFile] | None = None, *, tar_size: int | None = None, tar_sha256: str | None = None
    ):
        self._expected = None if manifest is None else {entry.path: entry for entry in manifest}
        self.members: dict[str, ManifestFile] = {}
        self._seen: set[str] = set()
        self._sizes: dict[str, int] = {}
        self._declared_size = tar_size
        self._declared_sha = tar_sha256
        self._tar_hash = _ThreadedSha256()
        self.size = 0
        self.sha256 = ""
        self._header = bytearray()
        self._member: tuple[str, int, object, str] | None = None  # path, remaining, hash, kind
        self._padding = 0
        self._pending_name: str | None = None
        self._pending_size: int | None = None
        self._ended = False
        self._zero_blocks = 0

    def feed(self, chunk: bytes) -> None:
        """Consume the next bytes of the tar; raises ``ManifestMismatch`` as soon as a difference shows."""
        if not chunk:
            return
        self._tar_hash.update(chunk)
        self.size += len(chunk)
        if self._declared_size is not None and self.size > self._declared_size:
            raise ManifestMismatch("size", f"the tar is longer than the declared {self._declared_size} bytes")
        view = memoryview(chunk)
        while view:
            view = self._step(view)

    def _step(self, view: memoryview) -> memoryview:
        if self._ended:
            if any(view):
                raise ManifestMismatch("tar", "non-zero bytes after the end of the archive")
            return view[len(view):]
        if self._member is not None:
            path, remaining, digest, kind = self._member
            take = min(remaining, len(view))
            digest.update(view[:take])
            remaining -= take
            if remaining == 0:
                self._member = None
                self._close_member(path, digest, kind)
            else:
                self._member = (path, remaining, digest, kind)
            return view[take:]
        if self._padding:
            take = min(self._padding, len(view))
            self._padding -= take
            return view[take:]
        need = BLOCK - len(self._header)
        self._header += view[:need]
        if len(self._header) == BLOCK:
            header, self._header = bytes(self._header), bytearray()
            self._on_header(header)
        return view[need:]

    def _on_header(self, header: bytes) -> None:
        if header == b"\x00" * BLOCK:
            self._zero_blocks += 1
            if self._zero_blocks == 2:
                self._ended = True
            return
        if self._zero_blocks:
            raise ManifestMismatch("tar", "a member follows an empty block")
        stored = _octal(header[148:156], "chksum")
        if stored != sum(header[:148]) + 256 + sum(header[156:]):
            raise ManifestMismatch("tar", "bad header checksum (not a tar, or corrupted)")
        kind = header[156:157]
        size = _octal(header[124:136], "size")
        name = header[:100].split(b"\x00", 1)[0]
        prefix = header[345:500].split(b"\x00", 1)[0] if header[257:262] == b"ustar" else b""
        path = (prefix + b"/" + name if prefix else name).decode("utf-8", "surrogateescape")
        if kind in (b"x", b"L"):
            self._member = (path, size, _Collect(), kind.decode())
            self._padding = -size % BLOCK
            if size == 0:
                self._member = None
                self._close_member(path, _Collect(), kind.decode())
            return
        if kind not in _REGULAR:
            raise ManifestMismatch("tar", f"member {path!r} is a {_KIND.get(kind, 'non-regular member')}")
        path = self._pending_name or path
        size = self._pending_size if self._pending_size is not None else size
        self._pending_name, self._pending_size = None, None
        check_member_path(path)
        if path in self._seen:
            raise ManifestMismatch("path", f"{path!r} appears twice in the tar")
        if self._expected is not None:
            _compare_size(path, size, self._expected)
        self._seen.add(path)
        self._sizes[path] = size
        self._padding = -size % BLOCK
        self._member = (path, size, hashlib.sha256(), "file")
        if size == 0:
            self._member = None
            self._close_member(path, hashlib.sha256(), "file")

    def _close_member(self, path: str, digest, kind: str) -> None:
        if kind == "x":
            records = _parse_pax(digest.data)
            self._pending_name = records.get("path", self._pending_name)
            if "size" in records:
                self._pending_size = int(records["size"])
        elif kind == "L":
            self._pending_name = digest.data.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")
        else:
            member = ManifestFile(path, self._sizes.pop(path), digest.hexdigest())
            self.members[path] = member
            if self._expected is not None:
                _compare_sha(member, self._expected)

    def finish(self) -> None:
        """Check that the archive ended cleanly and matches the declared size and SHA-256."""
        if self._member is not None or self._header or self._padding or not self._ended:
            raise ManifestMismatch("tar", f"the archive is truncated after {self.size} bytes")
        if self._expected is not None:
            _compare_missing(self._seen, self._expected)
        self.sha256 = self._tar_hash.hexdigest()
        if self._declared_size is not None and self.size != self._declared_size:
            raise ManifestMismatch("size", f"the tar is {self.size} bytes, {self._declared_size} were declared")
        if self._declared_sha is not None and self.sha256 != self._declared_sha:
            raise ManifestMismatch("sha256", f"the tar's SHA-256 is {self.sha256}, {self._declared_sha} was declared")


    def check_manifest(self, manifest: list[ManifestFile]) -> None:
        """After ``finish()``: compare the files found with a manifest that arrived later."""
        expected = {}
        for entry in manifest:
            check_member_path(entry.path)
            if entry.path in expected:
                raise ManifestMismatch("path", f"{entry.path!r} appears twice in the manifest")
            expected[entry.path] = entry
        for member in self.members.values():
            _compare_size(member.path, member.size, expected)
            _compare_sha(member, expected)
        _compare_missing(set(self.members), expected)


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


def _compare_missing(seen: set[str], expected: dict[str, ManifestFile]) -> None:
    missing = sorted(set(expected) - seen)
    if missing:
        raise ManifestMismatch("manifest", f"missing from the tar: {', '.join(repr(p) for p in missing[:5])}")


class _ThreadedSha256:
    """SHA-256 of the whole tar computed on a helper thread, beside the members' hashes on the caller's.

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
        self._executor.shutdown(wait=True)
        return self._hash.hexdigest()


class _Collect:
    """Gathers a (small) PAX or GNU long-name payload in memory."""

    def __init__(self):
        self.data = b""

    def update(self, chunk) -> None:
        if len(self.data) + len(chunk) > 1 << 20:
            raise ManifestMismatch("tar", "extended header larger than 1 MiB")
        self.data += bytes(chunk)
