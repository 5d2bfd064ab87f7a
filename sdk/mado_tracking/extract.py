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
"""

import json
from collections.abc import Iterable
from pathlib import Path

from mado_tracking.client import ApiClient
from mado_tracking.download import complete_checkpoint, stream_tar
from mado_tracking.errors import CheckpointError
from mado_tracking.extractdir import ExtractionDir, refuse_existing
from mado_tracking.resume import ENV_DIR, ENV_FILE, ENV_STEP
from mado_tracking.tarformat import Limits, ManifestMismatch
from mado_tracking.tarverify import CheckpointVerifier, ManifestFile

CHECKPOINT_DIR = "checkpoint"
RESUME_FILE = "resume-checkpoint.json"


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

    Raises:
        CheckpointError: the checkpoint is not complete, or its tar breaks
            the format or differs from its SHA-256, size or manifest
            (``Checkpoint <id> <what> mismatch: …``, docs/design/worker.md#refusal); nothing is
            left in ``directory``.
        ApiError: the server refused (404 for a checkpoint the token cannot
            see) or stayed unreachable through the retries.
    """
    if resource is None:
        resource = complete_checkpoint(client, checkpoint_id)
    size, sha256 = resource["tar_size"], resource["tar_sha256"]
    target = extract_checkpoint_stream(
        stream_tar(client, checkpoint_id, size=size, sha256=sha256),
        directory / CHECKPOINT_DIR,
        checkpoint_id=checkpoint_id,
        manifest=resource.get("manifest") or [],
        tar_size=size,
        tar_sha256=sha256,
    )
    info_path = directory / RESUME_FILE
    info = {"checkpointId": checkpoint_id, "sourceRunId": resource["run_id"], "step": resource["step"]}
    info_path.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    info_path.chmod(0o444)
    return {ENV_DIR: str(target), ENV_STEP: str(resource["step"]), ENV_FILE: str(info_path)}


def extract_checkpoint_stream(
    chunks: Iterable[bytes], target: Path, *, checkpoint_id, manifest: list[dict], tar_size: int, tar_sha256: str
) -> Path:
    """Verify and extract the tar whose bytes ``chunks`` yields into the new directory ``target``; return it.

    ``manifest`` (``[{"path", "size", "sha256"}]``) lists exactly the files
    the tar must hold; ``tar_size`` (bytes) and ``tar_sha256`` (hex) are the
    checkpoint's. The format's limits come from ``MADO_TAR_MAX_*`` (the
    server's defaults otherwise). Raises ``CheckpointError`` (``Checkpoint
    <id> <what> mismatch: …``) for anything the format refuses or any
    difference, leaving nothing behind; ``FileExistsError`` when ``target``
    exists.
    """

    def fail(what: str, detail: str) -> CheckpointError:
        return CheckpointError(f"Checkpoint {checkpoint_id} {what} mismatch: {detail}")

    files = [ManifestFile(entry["path"], entry["size"], entry["sha256"]) for entry in manifest]
    refuse_existing(target)
    with ExtractionDir(target.parent, ".checkpoint-", fail) as staging:
        verifier = CheckpointVerifier(
            files, tar_size=tar_size, tar_sha256=tar_sha256, limits=Limits.from_env(), writer=staging
        )
        try:
            for chunk in chunks:
                verifier.feed(chunk)
            verifier.finish()
        except ManifestMismatch as exc:
            raise fail(exc.what, exc.detail) from None
        finally:
            verifier.close()
        staging.commit(target, dir_mode=0o555)
    return target
