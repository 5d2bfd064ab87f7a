"""Safe extraction into a Job's working directory: the verified checkpoint and the Code archive (SPEC F13, F14).

Never ``tarfile.extractall`` (Python 3.11.7 predates the 2025 tarfile fixes,
so ``filter="data"`` is not enough) and no ``tarfile`` parsing at all
(``worker.tarread``). Every header is checked first; then each regular file
is written by this module with ``O_CREAT | O_EXCL | O_NOFOLLOW``, hashed as it
is written, into a fresh temporary directory inside the working directory,
whose real path every created path must stay under. Only when everything
was written is the temporary directory renamed to its final name (for the
checkpoint: files 0o444, directories 0o555). On any failure the temporary
directory is removed: no partial directory is left behind (ARCHITECTURE
rule 3).
"""

import hashlib
import json
import os
import posixpath
import shutil
import stat
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from checkpoints.models import Checkpoint
from checkpoints.tarverify import ManifestFile, ManifestMismatch, check_member_path
from worker.errors import ArchiveRejected, CheckpointMismatch
from worker.tarread import Fail, TarMember, read_members

CHECKPOINT_DIR = "checkpoint"
RESUME_FILE = "resume-checkpoint.json"
CODE_DIR = "code"
CHUNK = 1024 * 1024
CODE_MAX_BYTES = 4 * 1024**3  # uncompressed bytes of one Code archive (a decompression bomb stops here)
CODE_MAX_MEMBERS = 100_000
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def extract_checkpoint(
    *, checkpoint_id, tar_path: Path, workdir: Path, manifest: list[ManifestFile],
    on_progress: Callable[[], None] | None = None,
) -> Path:
    """Extract the checkpoint tar at ``tar_path`` into ``<workdir>/checkpoint``, read-only; return that path.

    ``manifest`` lists exactly the files the tar must hold. Every header is
    checked against it before any file is written (regular files only, safe
    normalised relative paths, no duplicates, sizes equal, none missing),
    then each file is written and its SHA-256 compared while writing. Raises
    ``CheckpointMismatch`` (nothing left behind) on any difference;
    ``FileExistsError`` when ``<workdir>/checkpoint`` already exists.
    ``on_progress()`` is called after each chunk written (a heartbeat).
    """
    target = Path(workdir) / CHECKPOINT_DIR

    def fail(what: str, detail: str) -> CheckpointMismatch:
        return CheckpointMismatch(checkpoint_id, what, detail)

    expected = {entry.path: entry for entry in manifest}
    _refuse_existing(target)
    with open(tar_path, "rb") as source:
        members = _checked_checkpoint_members(source, fail, expected, os.fstat(source.fileno()).st_size)
        with _Staging(Path(workdir), ".checkpoint-", fail) as staging:
            for member in members:
                source.seek(member.offset)
                staging.write_file(member.path, _read_limited(source, member.size, fail, on_progress), mode=0o444,
                                   expect=expected[member.path])
            staging.commit(target, dir_mode=0o555)
    return target


def _checked_checkpoint_members(source, fail: Fail, expected: dict[str, ManifestFile], size: int) -> list[TarMember]:
    members, seen = [], set()
    for member in read_members(source, fail, total_size=size):
        _check_path(member.path, fail)
        if member.path in seen:
            raise fail("path", f"{member.path!r} appears twice in the tar")
        entry = expected.get(member.path)
        if entry is None:
            raise fail("manifest", f"extra file {member.path!r} is in the tar but not in the manifest")
        if member.size != entry.size:
            raise fail("size", f"{member.path!r} is {member.size} bytes in the tar, {entry.size} in the manifest")
        seen.add(member.path)
        members.append(member)
    missing = sorted(set(expected) - seen)
    if missing:
        raise fail("manifest", f"missing from the tar: {', '.join(repr(p) for p in missing[:5])}")
    return members


def manifest_digest(manifest: Iterable[ManifestFile]) -> str:
    """SHA-256 (hex) of the canonical manifest JSON: ``[{"path","sha256","size"}…]`` sorted by path, keys sorted,
    separators ``,`` and ``:``, UTF-8, no trailing newline."""
    entries = [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in sorted(manifest, key=lambda f: f.path)]
    canonical = json.dumps(entries, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def write_resume_info(*, workdir: Path, checkpoint: Checkpoint, manifest: list[ManifestFile]) -> Path:
    """Write ``<workdir>/resume-checkpoint.json`` (read-only) for ``MMT_RESUME_CHECKPOINT_FILE`` (SPEC F14, F17).

    ``{"checkpointId", "sourceRunId", "step", "manifestSha256", "framework",
    "includesOptimizer"}``: ids are the database ids the API uses, ``step``
    the steps completed, ``manifestSha256`` = ``manifest_digest(manifest)``.
    """
    info = {
        "checkpointId": checkpoint.pk,
        "sourceRunId": checkpoint.run_id,
        "step": checkpoint.step,
        "manifestSha256": manifest_digest(manifest),
        "framework": checkpoint.framework,
        "includesOptimizer": checkpoint.includes_optimizer,
    }
    path = Path(workdir) / RESUME_FILE
    fd = os.open(path, _CREATE, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(info, out, indent=2)
        out.write("\n")
        os.fchmod(out.fileno(), 0o444)
    return path


def extract_code_archive(*, archive_path: Path, workdir: Path, label: str) -> Path:
    """Extract a Code version's source archive (tar, tar.gz/bz2/xz or zip) into ``<workdir>/code``; return it.

    The same rules as a checkpoint: every header checked first (regular
    files and directories only; no link, device or other member; safe
    relative paths, a leading ``./`` allowed; no duplicates; at most
    ``CODE_MAX_MEMBERS`` members and ``CODE_MAX_BYTES`` bytes), then each
    file written by us. Files keep an executable bit (0o755, else 0o644).
    ``label`` names the archive in errors. Raises ``ArchiveRejected``
    (nothing left behind).
    """
    target = Path(workdir) / CODE_DIR

    def fail(what: str, detail: str) -> ArchiveRejected:
        return ArchiveRejected(f"{label} rejected ({what}): {detail}")

    _refuse_existing(target)
    with open(archive_path, "rb") as probe:
        magic = probe.read(6)
    if magic[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        _extract_zip(Path(archive_path), Path(workdir), target, fail)
    else:
        _extract_code_tar(Path(archive_path), Path(workdir), target, fail, magic)
    return target


def _open_tar_stream(path: Path, magic: bytes):
    import bz2
    import gzip
    import lzma

    if magic[:2] == b"\x1f\x8b":
        return gzip.open(path, "rb"), None
    if magic[:3] == b"BZh":
        return bz2.open(path, "rb"), None
    if magic[:6] == b"\xfd7zXZ\x00":
        return lzma.open(path, "rb"), None
    return open(path, "rb"), path.stat().st_size  # noqa: SIM115 - closed by the caller


def _extract_code_tar(path: Path, workdir: Path, target: Path, fail: Fail, magic: bytes) -> None:
    stream, size = _open_tar_stream(path, magic)
    try:
        planned, total = [], 0
        for member in read_members(stream, fail, allow_dirs=True, total_size=size):
            rel = _code_path(member.path, member.is_dir, fail)
            total += member.size
            _check_code_limits(len(planned) + 1, total, fail)
            if rel is not None:
                planned.append((rel, member))
        stream.close()
        stream, _ = _open_tar_stream(path, magic)
        with _Staging(workdir, ".code-", fail) as staging:
            for rel, member in planned:
                if member.is_dir:
                    staging.make_dirs(rel, rel)
                    continue
                stream.seek(member.offset)
                staging.write_file(rel, _read_limited(stream, member.size, fail), mode=_code_mode(member.mode))
            staging.commit(target, dir_mode=0o755)
    except (OSError, EOFError) as exc:  # a corrupt compressed stream
        raise fail("archive", f"cannot be read: {exc}") from None
    finally:
        stream.close()


def _extract_zip(path: Path, workdir: Path, target: Path, fail: Fail) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            planned, total = [], 0
            for info in archive.infolist():
                if "\\" in info.filename:
                    raise fail("path", f"{info.filename!r} contains a backslash")
                kind = stat.S_IFMT(info.external_attr >> 16)
                if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
                    name = "symbolic link" if kind == stat.S_IFLNK else "non-regular member"
                    raise fail("member", f"{info.filename!r} is a {name}")
                if info.flag_bits & 0x1:
                    raise fail("archive", f"member {info.filename!r} is encrypted")
                rel = _code_path(info.filename, info.is_dir(), fail)
                total += info.file_size
                _check_code_limits(len(planned) + 1, total, fail)
                if rel is not None:
                    planned.append((rel, info))
            with _Staging(workdir, ".code-", fail) as staging:
                for rel, info in planned:
                    if info.is_dir():
                        staging.make_dirs(rel, rel)
                        continue
                    with archive.open(info) as source:
                        staging.write_file(rel, _read_limited(source, info.file_size, fail),
                                           mode=_code_mode(info.external_attr >> 16))
                staging.commit(target, dir_mode=0o755)
    except (zipfile.BadZipFile, NotImplementedError, EOFError, OSError) as exc:
        raise fail("archive", f"cannot be read: {exc}") from None


def _code_path(raw: str, is_dir: bool, fail: Fail) -> str | None:
    """The normalised relative path of a code member, or None for the archive's root (``./``)."""
    path = raw
    while path.startswith("./"):
        path = path[2:]
    if is_dir:
        path = path.rstrip("/")
    if path in ("", "."):
        return None
    _check_path(path, fail)
    return path


def _check_code_limits(count: int, total: int, fail: Fail) -> None:
    if count > CODE_MAX_MEMBERS:
        raise fail("archive", f"more than {CODE_MAX_MEMBERS} members")
    if total > CODE_MAX_BYTES:
        raise fail("archive", f"more than {CODE_MAX_BYTES} bytes once extracted")


def _code_mode(mode: int) -> int:
    return 0o755 if mode & 0o111 else 0o644


def _check_path(path: str, fail: Fail) -> None:
    try:
        check_member_path(path)
    except ManifestMismatch as exc:
        raise fail(exc.what, exc.detail) from None


def _read_limited(source, size: int, fail: Fail, on_progress: Callable[[], None] | None = None) -> Iterator[bytes]:
    remaining = size
    while remaining:
        data = source.read(min(CHUNK, remaining))
        if not data:
            raise fail("tar", f"the archive is truncated: {size - remaining} of {size} bytes of a member")
        remaining -= len(data)
        yield data
        if on_progress is not None:
            on_progress()


def _refuse_existing(target: Path) -> None:
    if os.path.lexists(target):
        raise FileExistsError(f"{target} already exists; a Job's working directory must be fresh")


class _Staging:
    """A fresh temporary directory inside ``parent`` that only this object writes into; removed unless committed."""

    def __init__(self, parent: Path, prefix: str, fail: Fail):
        self.root = tempfile.mkdtemp(prefix=prefix, dir=parent)
        self._real_root = os.path.realpath(self.root)
        self._fail = fail
        self._dirs: list[str] = []
        self._committed = False

    def __enter__(self) -> "_Staging":
        return self

    def __exit__(self, *exc_info) -> None:
        if not self._committed:
            remove_tree(Path(self.root))

    def _inside(self, full: str, rel: str) -> None:
        real = os.path.realpath(full)
        if not real.startswith(self._real_root + os.sep):
            raise self._fail("path", f"{rel!r} resolves outside the extraction directory")

    def make_dirs(self, rel_dir: str, rel: str) -> str:
        """Create the directories of ``rel_dir`` (``/``-separated) below the root; return the last one's path."""
        current = self.root
        for part in rel_dir.split("/") if rel_dir else ():
            current = os.path.join(current, part)
            try:
                os.mkdir(current, 0o700)
                self._dirs.append(current)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(current).st_mode):
                    raise self._fail("path", f"{rel!r} needs {part!r} as a directory, but it is a file") from None
            self._inside(current, rel)
        return current

    def write_file(
        self, rel: str, chunks: Iterable[bytes], *, mode: int, expect: ManifestFile | None = None
    ) -> None:
        """Create ``rel`` (never existing before, never through a link), write ``chunks``, check ``expect``."""
        parent = self.make_dirs(posixpath.dirname(rel), rel)
        full = os.path.join(parent, posixpath.basename(rel))
        self._inside(full, rel)
        try:
            fd = os.open(full, _CREATE, 0o600)
        except FileExistsError:
            raise self._fail("path", f"{rel!r} appears twice in the archive") from None
        digest, count = hashlib.sha256(), 0
        with os.fdopen(fd, "wb", buffering=0) as out:
            for chunk in chunks:
                count += len(chunk)
                digest.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[out.write(view):]
            os.fchmod(out.fileno(), mode)
        if expect is not None:
            if count != expect.size:
                raise self._fail("size", f"{rel!r} is {count} bytes, {expect.size} in the manifest")
            if digest.hexdigest() != expect.sha256:
                raise self._fail(
                    "sha256", f"{rel!r} has SHA-256 {digest.hexdigest()}, the manifest says {expect.sha256}"
                )

    def commit(self, target: Path, *, dir_mode: int) -> None:
        """Set the directories' mode (deepest first) and rename the root to ``target`` (which must not exist)."""
        for directory in reversed(self._dirs):
            os.chmod(directory, dir_mode)
        os.chmod(self.root, dir_mode)
        _refuse_existing(target)
        os.rename(self.root, target)
        self._committed = True


def remove_tree(path: Path, *, onerror: Callable | None = None) -> None:
    """Remove ``path`` and everything below it, read-only directories included; a missing path is fine."""
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
        return
    for dirpath, _dirnames, _filenames in os.walk(path):
        os.chmod(dirpath, 0o700)  # os.walk never descends into links, so only real directories get here
    shutil.rmtree(path, onerror=onerror)
