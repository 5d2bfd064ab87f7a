"""A checkpoint fetched for a resumed sweep trial: downloaded, verified, extracted read-only (SPEC F12–F14, F28).

``restore_checkpoint(client, id, directory)`` is what ``mado agent`` does
before it starts a requeued trial: ``download.fetch_tar`` streams the tar and
checks its size and SHA-256 against the checkpoint's ``tar_size`` /
``tar_sha256``; ``extract_checkpoint_tar`` then writes its files itself (never
``tarfile.extractall``): only regular files, each path relative, normalised
and without ``..``; the set of paths, every size and every SHA-256 must equal
the checkpoint's manifest (``GET checkpoints/{id}/``). Files end read-only
(0o444, directories 0o555). Last, ``resume-checkpoint.json``
(``{"checkpointId", "sourceRunId", "step"}``) is written beside the
directory, and the three ``MMT_RESUME_*`` variables that make
``run.resume_checkpoint()`` return it are returned.
"""

import hashlib
import json
import os
import posixpath
import tarfile
from pathlib import Path

from mado_tracking.client import ApiClient
from mado_tracking.download import fetch_tar
from mado_tracking.errors import CheckpointError
from mado_tracking.resume import ENV_DIR, ENV_FILE, ENV_STEP

CHECKPOINT_DIR = "checkpoint"
RESUME_FILE = "resume-checkpoint.json"
CHUNK = 1 << 20
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def restore_checkpoint(client: ApiClient, checkpoint_id: int, directory: Path) -> dict[str, str]:
    """Download, verify and extract complete checkpoint ``checkpoint_id`` into ``directory``; return the F14 variables.

    ``directory`` (an existing, empty directory) receives ``checkpoint/``
    (read-only) and ``resume-checkpoint.json``; the tar itself is removed
    once extracted. Returns ``{MMT_RESUME_CHECKPOINT_DIR, MMT_RESUME_STEP,
    MMT_RESUME_CHECKPOINT_FILE}`` as strings.

    Raises:
        CheckpointError: the checkpoint is not complete, or its tar differs
            from its SHA-256, size or manifest (``Checkpoint <id> <what>
            mismatch: …``, SPEC F15).
        ApiError: the server refused (404 for a checkpoint the token cannot
            see) or stayed unreachable through the retries.
    """
    resource = client.request("GET", f"checkpoints/{checkpoint_id}/", attempts=3)
    tar_path = fetch_tar(client, checkpoint_id, directory / "checkpoint.tar")
    try:
        target = extract_checkpoint_tar(tar_path, directory / CHECKPOINT_DIR, checkpoint_id=checkpoint_id,
                                        manifest=resource.get("manifest") or [])
    finally:
        tar_path.unlink(missing_ok=True)
    info_path = directory / RESUME_FILE
    info = {"checkpointId": checkpoint_id, "sourceRunId": resource["run_id"], "step": resource["step"]}
    info_path.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    info_path.chmod(0o444)
    return {ENV_DIR: str(target), ENV_STEP: str(resource["step"]), ENV_FILE: str(info_path)}


def extract_checkpoint_tar(tar_path: Path, target: Path, *, checkpoint_id, manifest: list[dict]) -> Path:
    """Extract the tar at ``tar_path`` into the new directory ``target`` (files 0o444, directories 0o555).

    ``manifest`` (``[{"path", "size", "sha256"}]``) lists exactly the files
    the tar must hold. Raises ``CheckpointError`` (``Checkpoint <id> <what>
    mismatch: …``) for a member that is not a regular file (link, directory,
    device…), an absolute path or one with ``..`` or empty parts, a path
    twice, a file missing from or extra to the manifest, or a size or SHA-256
    difference; what was written stays in ``target`` for the caller to remove.
    ``FileExistsError`` when ``target`` exists.
    """
    expected = {entry["path"]: entry for entry in manifest}

    def fail(what: str, detail: str) -> CheckpointError:
        return CheckpointError(f"Checkpoint {checkpoint_id} {what} mismatch: {detail}")

    target.mkdir(mode=0o700)
    seen: set[str] = set()
    try:
        with tarfile.open(tar_path, mode="r|") as tar:  # a stream: headers are read in order, never seeked
            for member in tar:
                path = _checked_path(member, fail)
                entry = expected.get(path)
                if entry is None:
                    raise fail("manifest", f"extra file {path!r} is in the tar but not in the manifest")
                if path in seen:
                    raise fail("path", f"{path!r} appears twice in the tar")
                seen.add(path)
                _write(target, path, tar.extractfile(member), entry, fail)
    except tarfile.TarError as exc:
        raise fail("tar", f"the tar cannot be read ({exc})") from None
    missing = sorted(set(expected) - seen)
    if missing:
        raise fail("manifest", f"missing from the tar: {', '.join(repr(p) for p in missing[:5])}")
    for current, dirnames, _ in os.walk(target, topdown=False):
        os.chmod(current, 0o555)
    return target


def _checked_path(member: tarfile.TarInfo, fail) -> str:
    path = member.name
    if not member.isreg():
        kind = "link" if member.issym() or member.islnk() else "directory" if member.isdir() else "special file"
        raise fail("member", f"{path!r} is a {kind}; a checkpoint holds regular files only")
    parts = path.split("/")
    if (path.startswith("/") or "\\" in path or "\x00" in path or posixpath.normpath(path) != path
            or any(part in ("", ".", "..") for part in parts)):
        raise fail("path", f"{path!r} is not a safe relative path")
    return path


def _write(target: Path, path: str, source, entry: dict, fail) -> None:
    parent = target.joinpath(*path.split("/")[:-1])
    try:
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(parent / posixpath.basename(path), _CREATE, 0o600)
    except OSError as exc:  # a file where a directory must be, or the reverse
        raise fail("path", f"{path!r} cannot be created ({exc.strerror or exc})") from None
    digest, size = hashlib.sha256(), 0
    with os.fdopen(fd, "wb") as out:
        while data := source.read(CHUNK):
            digest.update(data)
            size += len(data)
            out.write(data)
        os.fchmod(out.fileno(), 0o444)
    if size != entry["size"]:
        raise fail("size", f"{path!r} is {size} bytes, {entry['size']} in the manifest")
    if digest.hexdigest() != entry["sha256"]:
        raise fail("sha256", f"{path!r} has SHA-256 {digest.hexdigest()}, the manifest says {entry['sha256']}")
