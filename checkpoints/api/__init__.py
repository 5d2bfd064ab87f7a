"""DRF views of the checkpoints app: a Run's artifacts (``artifacts``) and Checkpoints (``checkpoints``)."""

from checkpoints.api.artifacts import (
    ArtifactDetailApi,
    ArtifactListApi,
    RangeNotSatisfiable,
    parse_range,
    ranged_download,
)
from checkpoints.api.checkpoint_files import CheckpointFileApi
from checkpoints.api.checkpoints import (
    CheckpointCompleteApi,
    CheckpointDetailApi,
    CheckpointListApi,
    CheckpointTarApi,
    CheckpointUploadPartsApi,
)

__all__ = [
    "ArtifactDetailApi",
    "ArtifactListApi",
    "CheckpointCompleteApi",
    "CheckpointDetailApi",
    "CheckpointFileApi",
    "CheckpointListApi",
    "CheckpointTarApi",
    "CheckpointUploadPartsApi",
    "RangeNotSatisfiable",
    "parse_range",
    "ranged_download",
]
