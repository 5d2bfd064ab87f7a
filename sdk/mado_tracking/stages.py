"""The body of ``Run.log_training_data_stage`` (docs/design/runs.md#data-stages-sdk), checked before any request."""

from collections.abc import Mapping, Sequence


def data_stage_body(start_step, input_dataset_version_ids, checkpoint_id, metadata) -> dict:
    """The ``POST runs/{id}/data-stages/`` body, checked here so a bad argument fails before any request."""
    if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
        raise ValueError(f"start_step must be an int >= 0, got {start_step!r}")
    if isinstance(input_dataset_version_ids, (str, bytes)) or not isinstance(input_dataset_version_ids, Sequence):
        raise ValueError("input_dataset_version_ids must be a list of dataset version ids (the full set)")
    ids = list(input_dataset_version_ids)
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"input_dataset_version_ids must be a non-empty list of int ids (the full set), got {ids!r}")
    checkpoint_id = getattr(checkpoint_id, "id", checkpoint_id)  # a SavedCheckpoint is accepted too
    if checkpoint_id is not None and (isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int)):
        raise ValueError(f"checkpoint_id must be an int or None, got {checkpoint_id!r}")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ValueError("metadata must be a mapping (a JSON object) or None")
    return {
        "start_step": start_step,
        "input_dataset_version_ids": ids,
        "checkpoint_id": checkpoint_id,
        "metadata": dict(metadata or {}),
    }
