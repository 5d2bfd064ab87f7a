"""Checkpoints extracted for a same-run resume, kept read-only in the SDK's cache
(docs/design/resume.md#resume-anywhere; docs/design/worker.md#verify, #extract).

``fetch(client, id)`` gives the directory of complete checkpoint ``id`` under
``<cache>/checkpoints/<server key>/<id>/``: ``checkpoint/`` (files 0o444,
directories 0o555), ``resume-checkpoint.json`` and ``mado-cache.json``.
``<cache>`` is ``MMT_CACHE_DIR``, else ``<cwd>/.mado/cache``; ``<server key>``
is a digest of the server's identity (``staging.server_key``: any spelling of
its URL). The bytes come through ``extract.restore_checkpoint``, the one-pass
download, verification and extraction ``mado agent`` uses, so nothing reaches
the directory unless every member matched the manifest and the tar its size
and SHA-256; a mismatch raises ``CheckpointError`` ("Checkpoint <id> <what>
mismatch: …") before the code can load anything.

``mado-cache.json`` is written last, inside the staging directory, and records
the checkpoint's ``layout``, ``tar_size``, ``tar_sha256`` and manifest as the
server gave them, its ``key`` (``content_key``: ``tar:<tar SHA-256>``, or for a
checkpoint saved through MLflow, which has no tar, ``files:<SHA-256 of the
canonical manifest>``) and, per extracted file, its size, mtime and ctime (ns).
An entry is reused only when that record still equals the server's answer and every file
on disk is exactly the recorded set with the recorded sizes and times: a
rewrite, a ``touch``, a ``chmod``, a file added or removed changes one of them
(the ctime cannot be set back), so such an entry, or one without a readable
record, is replaced, never trusted. Reading no byte keeps reuse cheap; a hard
link made to a cached file also changes its ctime and costs one download.

Concurrency: a fetch extracts into ``.<id>.<random>.partial`` beside the entry
and renames it into place. Two processes fetching the same checkpoint both
end with a whole entry: the second rename fails, the loser checks the
winner's entry and uses it. An ``flock`` on ``.<id>.lock`` (where the file
system has locks) makes the second process wait for the first instead of
downloading too, and lets it remove staging directories a killed process
left behind.
"""

import contextlib
import errno
import json
import logging
import os
import uuid
from pathlib import Path

from mado_tracking.client import ApiClient
from mado_tracking.download import complete_checkpoint
from mado_tracking.errors import MadoError
from mado_tracking.extract import CHECKPOINT_DIR, RESUME_FILE, restore_checkpoint
from mado_tracking.extractdir import remove_tree
from mado_tracking.resume import ResumeCheckpoint
from mado_tracking.staging import cache_root, server_key
from mado_tracking.tarverify import ManifestFile, manifest_digest

try:
    import fcntl
except ImportError:  # Windows: no lock; the rename still keeps entries whole
    fcntl = None

logger = logging.getLogger("mado_tracking")

RECORD_FILE = "mado-cache.json"
_TAKEN = (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR)


def cache_dir(api_url: str) -> Path:
    """``<cache>/checkpoints/<server key>``, absolute (not created here)."""
    return cache_root() / "checkpoints" / server_key(api_url)


def content_key(resource: dict) -> str:
    """What identifies the bytes of checkpoint ``resource`` (its API answer, with the manifest): ``tar:<hex>``
    (the tar's SHA-256) or, for a checkpoint made of separate files (``layout: "files"``, no tar),
    ``files:<hex>`` (the SHA-256 of its canonical manifest, ``tarverify.manifest_digest``)."""
    if resource.get("layout") == "files":
        files = (ManifestFile(e["path"], e["size"], e["sha256"]) for e in resource.get("manifest") or [])
        return f"files:{manifest_digest(files)}"
    return f"tar:{resource['tar_sha256']}"


def fetch(client: ApiClient, checkpoint_id: int, *, resource: dict | None = None) -> ResumeCheckpoint:
    """Complete checkpoint ``checkpoint_id`` extracted, verified, in the cache; reuse a cached copy that still fits.

    ``resource``: ``download.complete_checkpoint``'s answer when the caller
    has it. Returns a ``ResumeCheckpoint`` whose ``path`` is the read-only
    ``checkpoint/`` directory.

    Raises:
        CheckpointError: the checkpoint is not complete, or its bytes differ
            from its size, SHA-256 or manifest (nothing is left in the cache).
        ApiError: the server refused (404: not visible to the token) or stayed
            unreachable through the retries.
        OSError: the cache directory cannot be written.
    """
    if resource is None:
        resource = complete_checkpoint(client, checkpoint_id)
    directory = cache_dir(client.config.api_url)
    entry = directory / str(checkpoint_id)
    found, why = check(entry, resource)
    if found is not None:
        logger.info("mado: checkpoint %s is already in %s (verified when it was extracted)", checkpoint_id, entry)
        return found
    directory.mkdir(parents=True, exist_ok=True)
    with _locked(directory / f".{checkpoint_id}.lock") as locked:
        found, why = check(entry, resource)  # another process may have finished it while this one waited
        if found is not None:
            return found
        if why is not None:
            logger.warning("mado: the cached copy of checkpoint %s in %s %s; replacing it", checkpoint_id, entry, why)
        if locked:  # the only fetcher of this checkpoint now: what else is there, a killed process left
            for left in directory.glob(f".{checkpoint_id}.*.partial"):
                remove_tree(left)
        staging = directory / f".{checkpoint_id}.{uuid.uuid4().hex}.partial"
        staging.mkdir()
        try:
            logger.info(
                "mado: downloading checkpoint %s (step %s, %s bytes) into %s",
                checkpoint_id,
                resource.get("step"),
                resource.get("tar_size") or resource.get("total_bytes"),
                entry,
            )
            restore_checkpoint(client, checkpoint_id, staging, resource=resource)
            _write_record(staging, resource)
            staging.chmod(0o555)
            _install(staging, entry, resource)
        finally:
            remove_tree(staging)  # gone after the rename; what a failure left otherwise
    found, why = check(entry, resource)
    if found is None:
        raise MadoError(f"checkpoint {checkpoint_id}: its extracted copy in {entry} {why} right after extraction")
    return found


def check(entry: Path, resource: dict | None = None, *, key: str | None = None):
    """``(ResumeCheckpoint, None)`` when ``entry`` is a whole, unchanged extraction, else ``(None, reason)``.

    The reason is None when there is no entry at all. ``resource`` (the
    server's checkpoint with its manifest) must equal the record; without it
    (another rank, told by rank 0 which checkpoint) ``key`` (``content_key``) must.
    """
    if not os.path.lexists(entry):
        return None, None
    try:
        record = json.loads((entry / RECORD_FILE).read_text(encoding="utf-8"))
        info = json.loads((entry / RESUME_FILE).read_text(encoding="utf-8"))
        recorded_files = {path: tuple(stamp) for path, stamp in record["files"].items()}
        if recorded_key(record) != (content_key(resource) if resource is not None else key):
            return None, "holds another version of it (its tar's SHA-256 or its manifest differs)"
        if resource is not None and (
            record.get("tar_size") != resource.get("tar_size") or record["manifest"] != _manifest(resource)
        ):
            return None, "differs from the server's manifest"
        if info.get("step") != record["step"]:
            return None, "has a resume-checkpoint.json of another step"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"has no readable record of its extraction ({type(exc).__name__}: {exc})"
    changed = _changed(entry / CHECKPOINT_DIR, recorded_files)
    if changed is not None:
        return None, changed
    return (
        ResumeCheckpoint(
            path=entry / CHECKPOINT_DIR,
            step=record["step"],
            id=info.get("checkpointId"),
            source_run_id=info.get("sourceRunId"),
            info=info,
        ),
        None,
    )


def recorded_key(record: dict) -> str | None:
    """The ``content_key`` a cache record was written for (a record from before keys: its tar's SHA-256); None
    when it names neither."""
    if record.get("key"):
        return record["key"]
    return f"tar:{record['tar_sha256']}" if record.get("tar_sha256") else None


def _manifest(resource: dict) -> list[list]:
    return sorted([entry["path"], entry["size"], entry["sha256"]] for entry in resource.get("manifest") or [])


def _stamps(root: Path) -> dict[str, tuple[int, int, int]]:
    """``{relative POSIX path: (size, mtime_ns, ctime_ns)}`` of every entry below ``root`` that is not a directory."""
    found = {}
    for directory, subdirectories, files in os.walk(root):
        base = Path(directory).relative_to(root)
        for name in files + [name for name in subdirectories if os.path.islink(os.path.join(directory, name))]:
            info = os.lstat(os.path.join(directory, name))
            found[(base / name).as_posix()] = (info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    return found


def _changed(root: Path, recorded: dict) -> str | None:
    """A sentence saying how the files below ``root`` differ from ``recorded``; None when they do not."""
    if not root.is_dir() or root.is_symlink():
        return f"has no {CHECKPOINT_DIR}/ directory"
    on_disk = _stamps(root)
    for path in sorted(recorded.keys() | on_disk.keys()):
        if path not in on_disk:
            return f"lost {path}"
        if path not in recorded:
            return f"gained {path}"
        if on_disk[path] != recorded[path]:
            return f"has {path} changed since it was extracted"
    return None


def _write_record(staging: Path, resource: dict) -> None:
    record = {
        "checkpoint_id": resource["id"],
        "run_id": resource.get("run_id"),
        "step": resource["step"],
        "layout": resource.get("layout") or "tar",
        "key": content_key(resource),
        "tar_size": resource.get("tar_size"),
        "tar_sha256": resource.get("tar_sha256") or "",
        "manifest": _manifest(resource),
        "files": {path: list(stamp) for path, stamp in _stamps(staging / CHECKPOINT_DIR).items()},
    }
    path = staging / RECORD_FILE
    path.write_text(json.dumps(record, sort_keys=True) + "\n", encoding="utf-8")
    path.chmod(0o444)


def _install(staging: Path, entry: Path, resource: dict) -> None:
    """Rename ``staging`` to ``entry``; an entry that appeared meanwhile is used when whole, else moved aside."""
    for _ in range(3):
        try:
            os.rename(staging, entry)
            return
        except OSError as exc:
            if exc.errno not in _TAKEN:
                raise
        if check(entry, resource)[0] is not None:
            return  # another process won; its entry is as good as this one
        stale = entry.with_name(f".{entry.name}.{uuid.uuid4().hex}.stale")
        try:
            os.rename(entry, stale)
        except FileNotFoundError:
            continue
        remove_tree(stale)
    raise MadoError(f"cannot put checkpoint {entry.name} in {entry}: other processes keep replacing it")


@contextlib.contextmanager
def _locked(path: Path):
    """Hold an exclusive ``flock`` on ``path`` while the block runs; yields False where locks do not work."""
    if fcntl is None:
        yield False
        return
    try:
        handle = open(path, "a+b")  # noqa: SIM115 - closed below
    except OSError:
        yield False
        return
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        except OSError:  # a file system without locks
            yield False
            return
        yield True
