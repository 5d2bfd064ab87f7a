"""State changes of the checkpoints app (docs/design/house.md#where-logic-goes): artifacts, checkpoints and their
uploads.

``artifacts``: streamed artifact store / delete and Code archives (docs/design/checkpoints.md#a-checkpoint, #deletion);
``checkpoints``: register, delete, lock for use (docs/design/checkpoints.md#a-checkpoint, #deletion);
``uploads``: tar upload through the web process and completion (docs/design/checkpoints.md#a-checkpoint;
docs/design/worker.md#verify); ``direct``: presigned multipart upload to S3 and its verification
(docs/design/worker.md#fetch, #verify); ``janitor``: ending abandoned pending checkpoints ``error``
(docs/design/checkpoints.md#a-checkpoint; docs/design/worker.md#subprocess).
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
