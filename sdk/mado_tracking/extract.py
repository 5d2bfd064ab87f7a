"""A checkpoint restored for a resumed sweep trial: downloaded, verified and extracted in one pass
(docs/design/worker.md#fetch, #verify, #extract; docs/design/sweeps.md#requeue).

``restore_checkpoint(client, id, directory)`` is what ``mado agent`` does
before it starts a requeued trial (and ``mado_tracking.checkpoint_cache`` for
a same-run resume): the tar streams from ``GET
checkpoints/{id}/tar`` (``download.stream_tar``, a broken download resumes
with a ranged request) through ``tarverify.CheckpointVerifier`` (the one
strict tar reader, docs/checkpoint-format.md), which checks every member
against the checkpoint's manifest and the whole tar against its
``tar_size`` / ``tar_sha256``, while ``extractdir.ExtractionDir`` writes each file
(never ``tarfile``; the tar is never stored). Only when everything matched
is the staging directory renamed to ``checkpoint/`` (files 0o444,
directories 0o555). Last, ``resume-checkpoint.json`` (``{"checkpointId",
"sourceRunId", "step"}``) is written beside it, and the three
``MMT_RESUME_*`` variables that make ``run.resume_checkpoint()`` return it
are returned.

A checkpoint saved through MLflow has no tar (``layout: "files"``: one stored
file per manifest entry): ``extract_checkpoint_files`` checks every manifest
path with the tar reader's rules (``tarformat.check_path``, ``Names``) before
any byte is fetched, then streams each file from ``GET
checkpoints/{id}/files/<path>`` (``download.stream_file``, resumed the same
way) into the same staging directory, its size and SHA-256 computed while it
is written and compared with its manifest entry; the same rename makes it
``checkpoint/``, read-only (docs/design/checkpoints.md#mlflow-checkpoints).
"""

import json
from collections.abc import Iterable
from pathlib import Path

from mado_tracking.client import ApiClient
from mado_tracking.download import complete_checkpoint, stream_file, stream_tar
from mado_tracking.errors import CheckpointError
from mado_tracking.extractdir import ExtractionDir, refuse_existing
from mado_tracking.resume import ENV_DIR, ENV_FILE, ENV_STEP
from mado_tracking.tarformat import Limits, ManifestMismatch, Names, check_path
from mado_tracking.tarverify import CheckpointVerifier, ManifestFile

CHECKPOINT_DIR = "checkpoint"
RESUME_FILE = "resume-checkpoint.json"
FILES_LAYOUT = "files"
_SHA256_HEX = frozenset("0123456789abcdef")


def restore_checkpoint(
    client: ApiClient, checkpoint_id: int, directory: Path, *, resource: dict | None = None
) -> dict[str, str]:
    """Download, verify and extract complete checkpoint ``checkpoint_id`` into ``directory``; return the
    ``MMT_RESUME_*`` variables.

    ``directory`` (an existing, empty directory) receives ``checkpoint/``
    (read-only) and ``resume-checkpoint.json``. ``resource``: the answer of
    ``download.complete_checkpoint`` when the caller already has it (else it
    is asked for). Returns
    ``{MMT_RESUME_CHECKPOINT_DIR, MMT_RESUME_STEP, MMT_RESUME_CHECKPOINT_FILE}``
    as strings.

    A checkpoint with ``layout: "files"`` (saved through MLflow) is fetched
    file by file (``extract_checkpoint_files``), any other as its tar.

    Raises:
        CheckpointError: the checkpoint is not complete, or its tar breaks
            the format or differs from its SHA-256, size or manifest, or one of
            its files differs from its manifest entry
            (``Checkpoint <id> <what> mismatch: …``, docs/design/worker.md#refusal); nothing is
            left in ``directory``.
        ApiError: the server refused (404 for a checkpoint the token cannot
            see) or stayed unreachable through the retries.
    """
    if resource is None:
        resource = complete_checkpoint(client, checkpoint_id)
    manifest = resource.get("manifest") or []
    if resource.get("layout") == FILES_LAYOUT:
        target = extract_checkpoint_files(client, checkpoint_id, directory / CHECKPOINT_DIR, manifest=manifest)
    else:
        size, sha256 = resource["tar_size"], resource["tar_sha256"]
        target = extract_checkpoint_stream(
            stream_tar(client, checkpoint_id, size=size, sha256=sha256),
            directory / CHECKPOINT_DIR,
            checkpoint_id=checkpoint_id,
            manifest=manifest,
            tar_size=size,
            tar_sha256=sha256,
        )
    info_path = directory / RESUME_FILE
    info = {"checkpointId": checkpoint_id, "sourceRunId": resource["run_id"], "step": resource["step"]}
    info_path.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    info_path.chmod(0o444)
    return {ENV_DIR: str(target), ENV_STEP: str(resource["step"]), ENV_FILE: str(info_path)}


def extract_checkpoint_stream(
    chunks: Iterable[bytes],
    target: Path,
    *,
    checkpoint_id,
    manifest: list[dict],
    tar_size: int | None,
    tar_sha256: str | None,
    limits: Limits | None = None,
    threads: int | None = None,
    fail=None,
    check=None,
) -> Path:
    """Verify and extract the tar whose bytes ``chunks`` yields into the new directory ``target``; return it
    (docs/design/worker.md#verify, #extract).

    The one restore of a checkpoint's tar: ``mado agent``, ``mado checkpoint
    restore`` and the worker's (``worker.fetch``) all run it. ``manifest``
    (``[{"path", "size", "sha256"}]`` or ``ManifestFile``s) lists exactly the
    files the tar must hold; ``tar_size`` (bytes) and ``tar_sha256`` (hex) are
    the checkpoint's, or None when ``check`` compares them. ``limits``: the
    format's limits (default ``MADO_TAR_MAX_*``, the server's defaults
    otherwise). ``threads``: threads that hash at once (default
    ``hashing.hash_threads()``). ``fail(what, detail)`` builds the error raised for a
    difference (default ``CheckpointError('Checkpoint <id> <what> mismatch:
    …')``). ``check(verifier, bytes_written)``, called after every byte verified
    (``verifier.size``, ``.sha256``, ``.members``) and written, before the
    rename, may raise ``ManifestMismatch`` too. Files are hashed and
    written on ``hashing.hash_threads()`` threads (docs/design/checkpoints.md#hash-threads);
    the rename to ``target`` (files 0o444, directories 0o555) happens only
    after everything matched, else nothing is left behind. Raises what
    ``fail`` builds for anything the format refuses or any difference, what
    ``chunks`` raises (nothing left behind either), ``FileExistsError`` when
    ``target`` exists.
    """

    fail = fail or _mismatch(checkpoint_id)
    files = [entry if isinstance(entry, ManifestFile) else ManifestFile(**entry) for entry in manifest]
    refuse_existing(target)
    with ExtractionDir(target.parent, ".checkpoint-", fail) as staging:
        verifier = CheckpointVerifier(
            files,
            tar_size=tar_size,
            tar_sha256=tar_sha256,
            limits=Limits.from_env() if limits is None else limits,
            writer=staging,
            threads=threads,
        )
        try:
            for chunk in chunks:
                verifier.feed(chunk)
            verifier.finish()
            if check is not None:
                check(verifier, staging.bytes_written)
        except ManifestMismatch as exc:
            raise fail(exc.what, exc.detail) from None
        finally:
            verifier.close()
        staging.commit(target, dir_mode=0o555)
    return target


def _mismatch(checkpoint_id):
    def fail(what: str, detail: str) -> CheckpointError:
        return CheckpointError(f"Checkpoint {checkpoint_id} {what} mismatch: {detail}")

    return fail


def extract_checkpoint_files(client: ApiClient, checkpoint_id, target: Path, *, manifest: list[dict]) -> Path:
    """Download every file of ``manifest`` of checkpoint ``checkpoint_id`` (saved through MLflow, ``layout:
    "files"``) into the new directory ``target``, verified; return it (docs/design/worker.md#fetch, #verify, #extract).

    ``manifest`` (``[{"path", "size", "sha256"}]``, sizes in bytes) lists
    every file. All paths are checked first, with the tar reader's rules and
    the ``MADO_TAR_MAX_*`` limits; then each file streams from ``GET
    checkpoints/{id}/files/<path>`` in 1 MiB chunks (a broken download
    resumes with a ranged request) into the staging directory, never whole
    in memory, and its size and SHA-256 are compared with its entry. Only
    when every file matched is the staging directory renamed to ``target``
    (files 0o444, directories 0o555).

    Raises ``CheckpointError`` (``Checkpoint <id> <what> mismatch: …``,
    ``what``: ``manifest``, ``path``, ``size`` or ``sha256``) and leaves
    nothing behind; ``ApiError`` when a download keeps failing (nothing left
    either); ``FileExistsError`` when ``target`` exists.
    """
    fail = _mismatch(checkpoint_id)
    files = _manifest_files(manifest, Limits.from_env(), fail)
    refuse_existing(target)
    with ExtractionDir(target.parent, ".checkpoint-", fail) as staging:
        for expected in files:
            chunks = stream_file(client, checkpoint_id, expected.path, size=expected.size, sha256=expected.sha256)
            staging.write_file(expected.path, chunks, mode=0o444, expect=expected)
        staging.commit(target, dir_mode=0o555)
    return target


def _manifest_files(manifest: list[dict], limits: Limits, fail) -> list[ManifestFile]:
    """The manifest as ``ManifestFile``s sorted by path, every entry and path checked before any byte is fetched."""
    if not isinstance(manifest, list) or not manifest:
        raise fail("manifest", "the checkpoint records no files")
    if len(manifest) > limits.members:
        raise fail("manifest", f"{len(manifest)} files, more than the {limits.members} a checkpoint may hold")
    names, files, total = Names(limits), [], 0
    for number, entry in enumerate(manifest):
        try:
            path, size, sha256 = entry["path"], entry["size"], entry["sha256"]
        except (KeyError, TypeError):
            raise fail("manifest", f"entry {number} is not {{path, size, sha256}}: {entry!r}") from None
        if not isinstance(path, str):
            raise fail("manifest", f"entry {number} has path {path!r}, not text")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise fail("manifest", f"entry {number} ({path!r}) has size {size!r}, not a whole number of bytes")
        if not isinstance(sha256, str) or len(sha256) != 64 or not set(sha256) <= _SHA256_HEX:
            raise fail("manifest", f"entry {number} ({path!r}) has SHA-256 {sha256!r}, not 64 hex digits")
        try:
            names.add(check_path(path, limits), is_dir=False)
        except ManifestMismatch as exc:
            raise fail(exc.what, exc.detail) from None
        total += size
        files.append(ManifestFile(path, size, sha256))
    try:
        names.finish()
    except ManifestMismatch as exc:
        raise fail(exc.what, exc.detail) from None
    if total > limits.total_bytes:
        raise fail("manifest", f"{total} bytes in all, more than the {limits.total_bytes} a checkpoint may hold")
    return sorted(files, key=lambda f: f.path)
