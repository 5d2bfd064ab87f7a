"""State changes of the checkpoints app (STYLE: Services): artifacts, checkpoints and their uploads.

``artifacts``: streamed artifact store / delete and Code archives (SPEC F1, F5);
``checkpoints``: register, delete, lock for use (SPEC F1, F5);
``uploads``: tar upload through the web process and completion (SPEC F1, F13);
``direct``: presigned multipart upload to S3 and its verification (SPEC F12, F13);
``janitor``: ending abandoned pending checkpoints ``error`` (SPEC F1, F16).
"""

from checkpoints.services.artifacts import (
    artifact_delete,
    artifact_store,
    code_version_create_with_archive,
    validate_artifact_path,
)
from checkpoints.services.checkpoints import (
    checkpoint_delete,
    checkpoint_lock_for_use,
    checkpoint_register,
    discard_upload,
)
from checkpoints.services.direct import checkpoint_record_error, checkpoint_upload_parts, checkpoint_verify_upload
from checkpoints.services.janitor import checkpoint_end_abandoned, checkpoint_end_in_error
from checkpoints.services.uploads import checkpoint_complete, checkpoint_upload

__all__ = [
    "artifact_delete",
    "artifact_store",
    "checkpoint_complete",
    "checkpoint_delete",
    "checkpoint_end_abandoned",
    "checkpoint_end_in_error",
    "checkpoint_lock_for_use",
    "checkpoint_record_error",
    "checkpoint_register",
    "checkpoint_upload",
    "checkpoint_upload_parts",
    "checkpoint_verify_upload",
    "code_version_create_with_archive",
    "discard_upload",
    "validate_artifact_path",
]
