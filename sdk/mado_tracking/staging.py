"""Staging directories of background checkpoint saves (docs/design/checkpoints.md#a-checkpoint, #save-and-restore).

``run.log_checkpoint(dir, step, wait=False)`` snapshots ``dir`` into
``<cache>/staging/<server>/<project>/<run id>/step-<N>/`` and returns; a
thread uploads it from there. ``<cache>`` is ``MMT_CACHE_DIR``, else
``<cwd>/.mado/cache`` (the directory ``.mado/resume.json`` lives in, so a
same-run resume started from here finds it; usually the same file system as
the checkpoint directory, so hard links work). ``<server>`` is a short digest
of the server's identity (``config.server_identity``: the API URL in one
spelling, so ``http://localhost:8000/`` and ``http://127.0.0.1:8000`` find the
same directory).

Snapshot rule, per file: a file without any write permission bit is
hard-linked (it can only be replaced, not rewritten in place: that is how
``mado_tracking.torch.save_checkpoint`` writes), anything else is copied,
and so is a file a hard link cannot reach (another file system). A copy is
first tried as a copy-on-write clone (``FICLONE``: instant on XFS, Btrfs,
bcachefs, ZFS 2.2), then made kernel-side (ext4) by ``copy_file_range`` in
8 MiB windows, each written back and dropped from the page cache before the
next (``mado_tracking.writeback``: the copy, which the training loop waits
for, reuses the same pages instead of making the kernel find fresh ones, as
``shutil.copyfile`` does; docs/deploy.md, "Measured"; the
upload then reads the copy back from disk), else by
``shutil.copyfile`` (macOS, Windows). A hard link of a file that is rewritten in place
anyway (as root, read-only bits do not stop that) is caught before the
upload: its size and mtime no longer match the snapshot and the upload is
refused naming the file, never uploaded with other content.

A snapshot is written into a hidden ``.step-<N>.<random>.partial``
directory and renamed to ``step-<N>`` with its ``staged.json``
(``{"step", "run_id", "idempotency_key", "includes_optimizer", "framework", "metadata",
"files": {path: [size, mtime_ns]}}``) inside, so a killed process never
leaves a half-snapshot that looks complete. A ``step-<N>`` directory is
removed once its checkpoint is ``complete`` on the server; one left by a
process that died is uploaded by the next start of the same run.
"""

import hashlib
import json
import logging
import os
import shutil
import stat
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from mado_tracking.config import server_identity
from mado_tracking.errors import CheckpointError
from mado_tracking.tarstream import scan
from mado_tracking.writeback import copy_windowed

try:
    import fcntl
except ImportError:  # Windows: no clones, copies
    fcntl = None

logger = logging.getLogger("mado_tracking")

ENV_CACHE_DIR = "MMT_CACHE_DIR"
INFO_FILE = "staged.json"
_WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


@dataclass
class StagedCheckpoint:
    """A checkpoint snapshot waiting for its upload: ``directory`` (the ``step-<N>`` folder), the save's
    arguments, and ``files`` ``{relative path: (size in bytes, mtime in ns)}`` as snapshotted."""

    directory: Path
    step: int
    run_id: int
    idempotency_key: str
    includes_optimizer: bool = False
    framework: str | None = None
    metadata: dict | None = None
    files: dict = field(default_factory=dict)

    @property
    def content(self) -> Path:
        """The snapshotted checkpoint directory (what is uploaded)."""
        return self.directory / "files"

    def check_unchanged(self) -> None:
        """Raise ``CheckpointError`` naming the first snapshotted file whose size or mtime changed since."""
        for relative, (size, mtime_ns) in self.files.items():
            info = (self.content / relative).stat()
            if (info.st_size, info.st_mtime_ns) != (size, mtime_ns):
                raise CheckpointError(
                    f"{self.content / relative}: was rewritten in place after log_checkpoint "
                    f"returned (step {self.step}); write checkpoint files to a new name and "
                    "rename them, or save with wait=True",
                    field="step",
                )

    def discard(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def cache_root() -> Path:
    """``MMT_CACHE_DIR``, else ``<cwd>/.mado/cache``, absolute (not created here)."""
    root = os.environ.get(ENV_CACHE_DIR, "").strip() or str(Path(".mado") / "cache")
    return Path(root).absolute()


def make_read_only(directory: Path) -> None:
    """Take the write bits off every regular file under ``directory`` (a ``Path``; links are left alone), so a
    snapshot of it hard-links the files instead of copying them (the snapshot rule of the module docstring;
    docs/design/checkpoints.md#save-and-restore). Raises ``OSError`` from ``chmod`` (a file not this user's)."""
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(stat.S_IMODE(path.stat().st_mode) & ~_WRITE_BITS)


def server_key(api_url: str) -> str:
    """A short digest of the server ``api_url`` names (``config.server_identity``: any spelling of it)."""
    return hashlib.sha256(server_identity(api_url).encode("utf-8")).hexdigest()[:12]


def run_staging_dir(*, api_url: str, project: str, external_id: str) -> Path:
    """``<cache>/staging/<server key>/<project>/<run id>``, absolute (see the module docstring)."""
    return cache_root() / "staging" / server_key(api_url) / project / external_id


def earlier_run_staging_dir(*, api_url: str, project: str, external_id: str) -> Path | None:
    """Where SDKs that keyed by the URL's text kept this run's state, when that is not ``run_staging_dir``."""
    legacy = hashlib.sha256(api_url.encode("utf-8")).hexdigest()[:12]
    if legacy == server_key(api_url):
        return None
    return cache_root() / "staging" / legacy / project / external_id


def stage(
    source,
    *,
    root: Path,
    step: int,
    run_id: int,
    idempotency_key: str,
    includes_optimizer: bool,
    framework: str | None,
    metadata: dict | None = None,
) -> StagedCheckpoint:
    """Snapshot ``source`` into ``root/step-<step>`` (hard links or copies, see the module docstring).

    Raises ``CheckpointError`` naming the path, before anything is staged,
    for what ``log_checkpoint`` refuses (symbolic link, empty directory,
    non-regular file, missing directory), and when ``root/step-<step>``
    already exists (a snapshot of that step is still waiting for its upload).
    """
    files = scan(source)
    target = root / f"step-{step}"
    if target.exists():
        raise CheckpointError(f"{source}: step {step} is already waiting for its upload in {target}", field="step")
    root.mkdir(parents=True, exist_ok=True)
    partial = root / f".step-{step}.{uuid.uuid4().hex}.partial"
    staged = StagedCheckpoint(
        directory=target,
        step=step,
        run_id=run_id,
        idempotency_key=idempotency_key,
        includes_optimizer=bool(includes_optimizer),
        framework=framework,
        metadata=metadata,
    )
    try:
        for relative, path, _size in files:
            destination = partial / "files" / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            _snapshot_file(path, destination)
            info = destination.stat()
            staged.files[relative] = (info.st_size, info.st_mtime_ns)
        _write_info(partial, staged)
        try:
            partial.rename(target)
        except OSError:
            raise CheckpointError(
                f"{source}: step {step} is already waiting for its upload in {target}", field="step"
            ) from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return staged


def _snapshot_file(source: Path, destination: Path) -> None:
    if not os.stat(source).st_mode & _WRITE_BITS:
        try:
            os.link(source, destination)
            return
        except OSError:  # another file system, or links not allowed there
            pass
    if not _clone(source, destination) and not copy_windowed(source, destination):
        shutil.copyfile(source, destination)


def _clone(source: Path, destination: Path) -> bool:
    """Make ``destination`` a copy-on-write clone of ``source`` (Linux ``FICLONE``); False where not supported."""
    if fcntl is None or sys.platform != "linux":
        return False
    with open(source, "rb") as reader, open(destination, "wb") as writer:
        try:
            fcntl.ioctl(writer.fileno(), _FICLONE, reader.fileno())
            return True
        except OSError:  # ext4, tmpfs, another file system: copied instead
            return False


def _write_info(directory: Path, staged: StagedCheckpoint) -> None:
    info = {
        "step": staged.step,
        "run_id": staged.run_id,
        "idempotency_key": staged.idempotency_key,
        "includes_optimizer": staged.includes_optimizer,
        "framework": staged.framework,
        "metadata": staged.metadata,
        "files": {path: list(value) for path, value in staged.files.items()},
    }
    (directory / INFO_FILE).write_text(json.dumps(info, sort_keys=True) + "\n", encoding="utf-8")


def left_behind(root: Path, *, run_id: int) -> list[StagedCheckpoint]:
    """The snapshots in ``root`` of Run ``run_id`` (API id) that a process left unuploaded, by step.

    Half-written ``.partial`` directories are removed; a ``step-<N>`` with an
    unreadable ``staged.json`` or of another Run id (the server's database
    was reset) is left alone with a warning.
    """
    if not root.is_dir():
        return []
    found = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".step-") and entry.name.endswith(".partial"):
            shutil.rmtree(entry, ignore_errors=True)
            continue
        if not entry.name.startswith("step-"):
            continue
        try:
            info = json.loads((entry / INFO_FILE).read_text(encoding="utf-8"))
            staged = StagedCheckpoint(
                directory=entry,
                step=int(info["step"]),
                run_id=int(info["run_id"]),
                idempotency_key=str(info["idempotency_key"]),
                includes_optimizer=bool(info.get("includes_optimizer")),
                framework=info.get("framework") or None,
                metadata=info.get("metadata") or None,
                files={path: tuple(value) for path, value in info["files"].items()},
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.warning("mado: ignoring %s: not a readable checkpoint snapshot (%s)", entry, exc)
            continue
        if staged.run_id != run_id:
            logger.warning(
                "mado: ignoring %s: it belongs to run %s on this server, not %s", entry, staged.run_id, run_id
            )
            continue
        found.append(staged)
    return sorted(found, key=lambda staged: staged.step)
