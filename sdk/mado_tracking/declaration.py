"""The body of ``POST checkpoints/{id}/complete/`` for a tar the SDK sent (docs/design/checkpoints.md#a-checkpoint;
docs/api.md "Checkpoints").

Up to ``INLINE_FILES`` files the manifest travels whole (``manifest``);
beyond that only its digest does (``manifest_sha256``, the SHA-256 of its
canonical JSON): the server builds the manifest from the files it found in
the tar while verifying it, and refuses the checkpoint unless they have that
digest. So the body stays a few hundred bytes for 10^5 files, far below any
request size limit.
"""

from mado_tracking.tarverify import ManifestFile, manifest_digest

INLINE_FILES = 1000


def checkpoint_declaration(*, tar_size: int, manifest: list[dict], tar_sha256: str | None = None) -> dict:
    """``{tar_size, manifest}`` or, past ``INLINE_FILES`` files, ``{tar_size, manifest_sha256}``; plus ``tar_sha256``
    when given.

    ``tar_size`` in bytes, ``manifest`` ``[{path, size, sha256}]`` (every file), ``tar_sha256`` hex or None: the
    server computes the tar's SHA-256 itself and checks every header and file, so the SDK does not hash the
    whole tar (docs/design/checkpoints.md#a-checkpoint; docs/design/worker.md#verify).
    """
    declared = {"tar_size": tar_size} if tar_sha256 is None else {"tar_size": tar_size, "tar_sha256": tar_sha256}
    if len(manifest) <= INLINE_FILES:
        return {**declared, "manifest": manifest}
    files = (ManifestFile(entry["path"], entry["size"], entry["sha256"]) for entry in manifest)
    return {**declared, "manifest_sha256": manifest_digest(files)}
