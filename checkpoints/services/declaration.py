"""The client's declaration of a checkpoint upload, checked and compared with what the tar held
(docs/design/checkpoints.md#a-checkpoint; docs/design/worker.md#verify).

A declaration is ``{tar_size, tar_sha256, manifest}`` with ``manifest`` the
list of every file, or ``{tar_size, tar_sha256, manifest_sha256}`` with the
SHA-256 of that list's canonical JSON (``mado_tracking.tarverify.
manifest_digest``): a checkpoint of 10^5 files is declared in a few hundred
bytes, and its manifest is the list of files the server's one pass over the
tar found (each hashed there), which must have that digest.

``tar_sha256`` may be left out (None): the server's one pass checks every
header, the zero padding and each file against the manifest, so the client's
hash of the whole tar adds no protection; the server records the SHA-256 it
computed (what a restore then checks the stored bytes against). The SDK
leaves it out, so it hashes each byte once.
"""

import re

from django.conf import settings

from checkpoints.models import Checkpoint
from checkpoints.services._common import mismatch
from checkpoints.services.shards import check_shards
from mado.errors import ValidationFailed
from mado_tracking.tarformat import Names, check_path
from mado_tracking.tarverify import ManifestFile, ManifestMismatch, compare_members, manifest_digest

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _hex_digest(value, field: str) -> str:
    digest = value.strip().lower() if isinstance(value, str) else ""
    if not _SHA256.match(digest):
        raise ValidationFailed(f"{field} must be 64 hexadecimal digits", field=field)
    return digest


def clean_declaration(*, tar_size, tar_sha256, manifest, manifest_sha256) -> dict:
    """The declaration as stored (manifest sorted by path); ``ValidationFailed`` naming the field otherwise.

    ``tar_size``: bytes >= 0; ``tar_sha256`` (None: not declared, the
    server's own hash is recorded) and ``manifest_sha256``: 64 hex
    digits; exactly one of ``manifest`` (``[{path, size, sha256}]``, paths
    under the checkpoint format's rules, docs/checkpoint-format.md) and
    ``manifest_sha256``.
    """
    if isinstance(tar_size, bool) or not isinstance(tar_size, int) or tar_size < 0:
        raise ValidationFailed("tar_size must be a non-negative integer (bytes)", field="tar_size")
    declared = {
        "tar_size": tar_size,
        "tar_sha256": None if tar_sha256 is None else _hex_digest(tar_sha256, "tar_sha256"),
    }
    if (manifest is None) == (manifest_sha256 is None):
        raise ValidationFailed("send either manifest (every file) or manifest_sha256 (its digest)", field="manifest")
    if manifest_sha256 is not None:
        return {**declared, "manifest_sha256": _hex_digest(manifest_sha256, "manifest_sha256")}
    files = _clean_manifest(manifest)
    entries = sorted(({"path": f.path, "size": f.size, "sha256": f.sha256} for f in files), key=lambda e: e["path"])
    return {**declared, "manifest": entries}


def _clean_manifest(manifest) -> list[ManifestFile]:
    limits = settings.MADO_TAR_LIMITS
    if not isinstance(manifest, list):
        raise ValidationFailed("manifest must be a list of {path, size, sha256}", field="manifest")
    if len(manifest) > limits.members:
        raise ValidationFailed(f"{len(manifest)} files: a checkpoint holds at most {limits.members}", field="manifest")
    files, names = [], Names(limits)
    for index, entry in enumerate(manifest):
        name = f"manifest[{index}]"
        if not isinstance(entry, dict):
            raise ValidationFailed("must be an object {path, size, sha256}", field=name)
        path, size = entry.get("path"), entry.get("size")
        if not isinstance(path, str):
            raise ValidationFailed("path must be a string", field=f"{name}.path")
        try:
            names.add(check_path(path, limits), is_dir=False)
        except ManifestMismatch as exc:
            raise ValidationFailed(f"path {exc.detail}", field=f"{name}.path") from None
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValidationFailed("size must be a non-negative integer (bytes)", field=f"{name}.size")
        files.append(ManifestFile(path, size, _hex_digest(entry.get("sha256"), f"{name}.sha256")))
    try:
        names.finish()
    except ManifestMismatch as exc:
        raise ValidationFailed(f"path {exc.detail}", field="manifest") from None
    return files


def declared_files(declared: dict) -> list[ManifestFile] | None:
    """The declared manifest, or None when only its digest was declared."""
    if "manifest" not in declared:
        return None
    return [ManifestFile(e["path"], e["size"], e["sha256"]) for e in declared["manifest"]]


def check_members(
    declared: dict, found: dict[str, ManifestFile], *, world_size: int | None = None
) -> list[ManifestFile]:
    """The checkpoint's manifest once the tar's files (``found``, path → file) matched the declaration.

    ``world_size``: the checkpoint's (a sharded ``torch-dcp`` one, docs/design/worker.md#distributed):
    every rank's shard must be among the files. Raises ``ManifestMismatch``
    (``manifest``, ``size`` or ``sha256``) naming the difference.
    """
    files = declared_files(declared)
    if files is not None:
        compare_members(found, files)
    else:
        digest = manifest_digest(found.values())
        if digest != declared["manifest_sha256"]:
            raise ManifestMismatch(
                "manifest",
                f"the tar's {len(found)} files have manifest SHA-256 {digest}, "
                f"{declared['manifest_sha256']} was declared",
            )
        files = sorted(found.values(), key=lambda f: f.path)
    check_shards(files, world_size)
    return files


def compare_received(row: Checkpoint, declared: dict) -> list[ManifestFile]:
    """The manifest of the tar uploaded through the web process, once it matched ``declared``.

    Raises ``ValidationFailed`` ``Checkpoint <id> <what> mismatch: …`` naming the field that differs.
    """
    received = row.received
    if received["size"] != declared["tar_size"]:
        detail = f"the stored tar is {received['size']} bytes, {declared['tar_size']} were declared"
        raise ValidationFailed(mismatch(row.pk, ManifestMismatch("size", detail)), field="tar_size")
    if declared["tar_sha256"] is not None and received["sha256"] != declared["tar_sha256"]:
        detail = f"the stored tar's SHA-256 is {received['sha256']}, {declared['tar_sha256']} was declared"
        raise ValidationFailed(mismatch(row.pk, ManifestMismatch("sha256", detail)), field="tar_sha256")
    found = {m["path"]: ManifestFile(m["path"], m["size"], m["sha256"]) for m in received["members"]}
    try:
        return check_members(declared, found, world_size=row.world_size)
    except ManifestMismatch as exc:
        raise ValidationFailed(mismatch(row.pk, exc), field="manifest") from None


def same_declaration(declared: dict, *, tar_size: int, tar_sha256: str, files: list[ManifestFile]) -> bool:
    """Whether ``declared`` describes the complete checkpoint's tar and files (a replayed ``complete``)."""
    if declared["tar_size"] != tar_size or declared["tar_sha256"] not in (None, tar_sha256):
        return False
    try:
        check_members(declared, {f.path: f for f in files})
    except ManifestMismatch:
        return False
    return True
