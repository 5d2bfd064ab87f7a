"""Safe extraction into a Job's working directory: the checkpoint and the Code archive
(docs/design/worker.md#verify, #extract).

Never ``tarfile``: tars are parsed by the one strict reader of the format
(``mado_tracking.tarformat``, docs/checkpoint-format.md). Each regular file
is written by this module with ``O_CREAT | O_EXCL | O_NOFOLLOW`` into a
fresh temporary directory inside the working directory, whose real path
every created path must stay under (``mado_tracking.extractdir``, also the sink
the reader writes a checkpoint's files into while it verifies them, see
``worker.fetch``). Only when everything was written and verified is the
temporary directory renamed to its final name (for the checkpoint: files
0o444, directories 0o555). On any failure the temporary directory is
removed: no partial directory is left behind (docs/design/house.md#verify-first).
"""

import json
import os
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path

from checkpoints.models import Checkpoint
from mado_tracking.extractdir import _CREATE, ExtractionDir, Fail, refuse_existing, remove_tree
from mado_tracking.tarformat import Limits, ManifestMismatch, Member, TarReader, check_path
from mado_tracking.tarverify import ManifestFile, manifest_digest
from worker.errors import ArchiveRejected

CHECKPOINT_DIR = "checkpoint"
RESUME_FILE = "resume-checkpoint.json"
CODE_DIR = "code"
CHUNK = 1024 * 1024
CODE_MAX_BYTES = 4 * 1024**3  # uncompressed bytes of one Code archive (a decompression bomb stops here)
CODE_MAX_MEMBERS = 100_000
# A source tree may nest deeper than a checkpoint (a vendored package's own tree); nothing recurses over depth.
CODE_MAX_DEPTH = 1024


def _code_limits() -> Limits:
    """What one Code archive may hold (read at each call: the module's limits may be changed)."""
    return Limits(members=CODE_MAX_MEMBERS, total_bytes=CODE_MAX_BYTES, depth=CODE_MAX_DEPTH, name_bytes=64 << 20)


__all__ = ["extract_code_archive", "refuse_existing", "remove_tree", "write_resume_info"]


def write_resume_info(*, workdir: Path, checkpoint: Checkpoint, manifest: list[ManifestFile]) -> Path:
    """Write ``<workdir>/resume-checkpoint.json`` (read-only) for ``MMT_RESUME_CHECKPOINT_FILE``
    (docs/design/worker.md#extract; docs/design/resume.md#in-the-code).

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

    The rules of the checkpoint format (docs/checkpoint-format.md: regular
    files and directories only; no link, device or other member; safe
    relative paths, a leading ``./`` allowed; no duplicates or collisions),
    at most ``CODE_MAX_MEMBERS`` members, ``CODE_MAX_BYTES`` bytes, ``CODE_MAX_DEPTH`` levels; each
    file written by us into a staging directory as it is read. Files keep an executable bit (0o755, else 0o644).
    ``label`` names the archive in errors. Raises ``ArchiveRejected``
    (nothing left behind).
    """
    target = Path(workdir) / CODE_DIR

    def fail(what: str, detail: str) -> ArchiveRejected:
        return ArchiveRejected(f"{label} rejected ({what}): {detail}")

    refuse_existing(target)
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
        return gzip.open(path, "rb")
    if magic[:3] == b"BZh":
        return bz2.open(path, "rb")
    if magic[:6] == b"\xfd7zXZ\x00":
        return lzma.open(path, "rb")
    return open(path, "rb")  # noqa: SIM115 - closed by the caller


def _extract_code_tar(path: Path, workdir: Path, target: Path, fail: Fail, magic: bytes) -> None:
    limits = _code_limits()
    try:
        with (
            _open_tar_stream(path, magic) as stream,
            ExtractionDir(workdir, ".code-", fail, mode_of=_code_mode) as staging,
        ):
            reader = TarReader(staging, limits=limits, code_paths=True)
            while chunk := stream.read(CHUNK):
                reader.feed(chunk)
            reader.finish()
            staging.commit(target, dir_mode=0o755)
    except ManifestMismatch as exc:
        raise fail("archive" if exc.what == "tar" else exc.what, exc.detail) from None
    except (OSError, EOFError) as exc:  # a corrupt compressed stream
        raise fail("archive", f"cannot be read: {exc}") from None


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
            with ExtractionDir(workdir, ".code-", fail) as staging:
                for rel, info in planned:
                    if info.is_dir():
                        staging.make_dirs(rel, rel)
                        continue
                    with archive.open(info) as source:
                        staging.write_file(
                            rel,
                            _read_limited(source, info.file_size, fail),
                            mode=_code_mode_bits(info.external_attr >> 16),
                        )
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
    _check_path(path, fail, _code_limits())
    return path


def _check_code_limits(count: int, total: int, fail: Fail) -> None:
    if count > CODE_MAX_MEMBERS:
        raise fail("archive", f"more than {CODE_MAX_MEMBERS} members")
    if total > CODE_MAX_BYTES:
        raise fail("archive", f"more than {CODE_MAX_BYTES} bytes once extracted")


def _code_mode_bits(mode: int) -> int:
    return 0o755 if mode & 0o111 else 0o644


def _code_mode(member: Member) -> int:
    return _code_mode_bits(member.mode)


def _check_path(path: str, fail: Fail, limits: Limits = Limits()) -> None:
    try:
        check_path(path, limits)
    except ManifestMismatch as exc:
        raise fail(exc.what, exc.detail) from None


def _read_limited(source, size: int, fail: Fail) -> Iterator[bytes]:
    remaining = size
    while remaining:
        data = source.read(min(CHUNK, remaining))
        if not data:
            raise fail("archive", f"truncated: {size - remaining} of {size} bytes of a member")
        remaining -= len(data)
        yield data
