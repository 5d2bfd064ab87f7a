"""What the saving code says about a checkpoint: ``Checkpoint.metadata`` (docs/design/checkpoints.md#metadata).

A JSON object sent with the registration and never changed afterwards. Two keys have a meaning here:
``preemption`` (``{"signal": "SIGTERM", "signal_at": <unix seconds>}``: the checkpoint was saved because the
process was told to stop; the API adds the seconds from that signal to ``complete``) and ``training_state``
(what the checkpoint holds, filled by the SDK's helpers). Anything else is kept as sent.
"""

import json
import math

from mado.errors import ValidationFailed

METADATA_MAX_BYTES = 64 * 1024
METADATA_MAX_DEPTH = 8
SIGNAL_NAME_MAX = 20


def clean_checkpoint_metadata(value) -> dict:
    """``value`` as a checkpoint's metadata: a JSON object of at most 64 KiB and 8 levels (None → ``{}``).

    Raises ``ValidationFailed`` naming the field (``metadata`` or ``metadata.preemption.<key>``) for anything
    else: not an object, a key that is not a string, a float that is not finite, too large or too deep, or a
    ``preemption`` that is not ``{"signal": name, "signal_at": unix seconds >= 0}``.
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationFailed("metadata must be a JSON object", field="metadata")
    _check_value(value, depth=1)
    try:
        size = len(json.dumps(value, allow_nan=False, separators=(",", ":")).encode("utf-8"))
    except ValueError:
        raise ValidationFailed("metadata must hold finite numbers only", field="metadata") from None
    if size > METADATA_MAX_BYTES:
        raise ValidationFailed(
            f"metadata must be at most {METADATA_MAX_BYTES} bytes of JSON, not {size}", field="metadata"
        )
    if "preemption" in value:
        _check_preemption(value["preemption"])
    return value


def _check_value(value, *, depth: int) -> None:
    if depth > METADATA_MAX_DEPTH:
        raise ValidationFailed(f"metadata must be at most {METADATA_MAX_DEPTH} levels deep", field="metadata")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValidationFailed("metadata keys must be strings", field="metadata")
            _check_value(item, depth=depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_value(item, depth=depth + 1)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValidationFailed("metadata must hold finite numbers only", field="metadata")
    elif value is not None and not isinstance(value, str | int | float | bool):
        raise ValidationFailed(f"metadata cannot hold a {type(value).__name__}", field="metadata")


def _check_preemption(preemption) -> None:
    if not isinstance(preemption, dict):
        raise ValidationFailed("metadata.preemption must be an object {signal, signal_at}", field="metadata.preemption")
    signal = preemption.get("signal")
    if not isinstance(signal, str) or not 1 <= len(signal) <= SIGNAL_NAME_MAX:
        raise ValidationFailed(
            f"metadata.preemption.signal must be a signal name of 1 to {SIGNAL_NAME_MAX} characters",
            field="metadata.preemption.signal",
        )
    signal_at = preemption.get("signal_at")
    if isinstance(signal_at, bool) or not isinstance(signal_at, int | float) or signal_at < 0:
        raise ValidationFailed(
            "metadata.preemption.signal_at must be the signal's time in seconds since the epoch",
            field="metadata.preemption.signal_at",
        )
