"""Sharded checkpoints written by ``torch.distributed.checkpoint`` from every rank (docs/design/worker.md#distributed).

A ``torch-dcp`` checkpoint registered with ``world_size`` N completes only
when its manifest holds DCP's ``.metadata`` and at least one shard file
``__<rank>_<n>.distcp`` of each rank 0..N-1, and no shard of a rank >= N: a
save that one rank did not finish, or a directory mixing two saves, is never
``complete``. The bytes of each shard are checked like every other file
(manifest sizes and SHA-256, docs/design/checkpoints.md#a-checkpoint; docs/design/worker.md#verify).
"""

import re

from mado.errors import ValidationFailed
from mado_tracking.tarverify import ManifestFile, ManifestMismatch

DCP_FRAMEWORK = "torch-dcp"
DCP_METADATA = ".metadata"
_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")


def clean_world_size(framework: str, world_size) -> int | None:
    """``world_size`` of a registration: an int >= 1 for ``torch-dcp``, None for any other framework.

    Raises ``ValidationFailed`` (field ``world_size``) when it is missing or
    not a positive int for ``torch-dcp``, or given for another framework.
    """
    if framework != DCP_FRAMEWORK:
        if world_size is not None:
            raise ValidationFailed(
                f"world_size is only for framework {DCP_FRAMEWORK!r} (sharded checkpoints)", field="world_size"
            )
        return None
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValidationFailed(
            f"framework {DCP_FRAMEWORK!r} needs world_size, the number of processes that wrote "
            f"the shards (an int >= 1), got {world_size!r}",
            field="world_size",
        )
    return world_size


def check_shards(files: list[ManifestFile], world_size: int | None) -> None:
    """Refuse a sharded checkpoint's manifest that lacks a rank's shard (``ManifestMismatch("manifest", …)``).

    ``world_size`` None (not a ``torch-dcp`` checkpoint): nothing to check.
    """
    if world_size is None:
        return
    paths = {file.path for file in files}
    if DCP_METADATA not in paths:
        raise ManifestMismatch(
            "manifest",
            f"the sharded checkpoint has no {DCP_METADATA} file (written last by "
            "rank 0 of torch.distributed.checkpoint.save)",
        )
    ranks = {int(match.group(1)) for match in map(_SHARD.match, paths) if match}
    missing = sorted(set(range(world_size)) - ranks)
    if missing:
        raise ManifestMismatch(
            "manifest",
            f"no shard of rank(s) {', '.join(map(str, missing[:10]))} of the "
            f"world_size {world_size} that saved it (__<rank>_<n>.distcp)",
        )
    extra = sorted(rank for rank in ranks if rank >= world_size)
    if extra:
        raise ManifestMismatch(
            "manifest",
            f"shards of rank(s) {', '.join(map(str, extra[:10]))}, beyond the "
            f"world_size {world_size} that saved it: files of another save",
        )
