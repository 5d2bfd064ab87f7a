"""The body of ``POST checkpoints/{id}/complete/`` for a tar the SDK sent (SPEC F1; docs/api.md "Checkpoints").

Up to ``INLINE_FILES`` files the manifest travels whole (``manifest``);
beyond that only its digest does (``manifest_sha256``, the SHA-256 of its
canonical JSON): the server builds the manifest from the files it found in
the tar while verifying it, and refuses the checkpoint unless they have that
digest. So the body stays a few hundred bytes for 10^5 files, far below any
request size limit.
"""

from mado_tracking.tarverify import ManifestFile, manifest_digest

INLINE_FILES = 1000


def checkpoint_declaration(*, tar_size: int, tar_sha256: str, manifest: list[dict]) -> dict:
    """``{tar_size, tar_sha256, manifest}`` or, past ``INLINE_FILES`` files, ``{tar_size, tar_sha256, manifest_sha256}``.

    ``tar_size`` in bytes, ``tar_sha256`` hex, ``manifest`` ``[{path, size, sha256}]`` (every file).
    """
    if len(manifest) <= INLINE_FILES:
        return {"tar_size": tar_size, "tar_sha256": tar_sha256, "manifest": manifest}
    files = (ManifestFile(entry["path"], entry["size"], entry["sha256"]) for entry in manifest)
    return {"tar_size": tar_size, "tar_sha256": tar_sha256, "manifest_sha256": manifest_digest(files)}
