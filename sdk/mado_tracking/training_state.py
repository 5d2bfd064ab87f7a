"""The ``training_state`` metadata ``run.log_checkpoint`` sends (docs/design/checkpoints.md#metadata, #training-state).

``with_training_state`` adds it to a checkpoint's metadata: from ``state=``
(the live objects the directory was saved from, fingerprinted now), else from
the directory's ``mado-checkpoint.json`` written by
``mado_tracking.torch.save_checkpoint``; metadata that already holds a
``training_state`` is sent as it is. Without any, the checkpoint's training
state is "unknown" on the server.
"""

import json
import sys
from collections.abc import Mapping
from pathlib import Path

from mado_tracking.errors import CheckpointError
from mado_tracking.fingerprint import rng_parts, training_state

INFO_FILE = "mado-checkpoint.json"
STATE_KEYS = ("model", "optimizer", "scheduler", "scaler", "generators", "data_position", "rng")
MAX_BYTES = 32 * 1024  # half of what checkpoint metadata may hold


def read_training_state(directory) -> dict | None:
    """The ``training_state`` of ``directory``'s ``mado-checkpoint.json``, or None (no such file, not JSON, none)."""
    try:
        info = json.loads((Path(directory) / INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    found = info.get("training_state") if isinstance(info, dict) else None
    return found if isinstance(found, dict) else None


def live_training_state(state: Mapping, *, step: int, directory) -> dict:
    """The ``training_state`` of the live objects in ``state`` at ``step`` (docs/design/checkpoints.md#training-state).

    ``state`` keys: ``model``, ``optimizer``, ``scheduler``, ``scaler``
    (objects with ``state_dict()``), ``generators`` (``{name:
    torch.Generator}``), ``data_position`` (an object with ``state_dict()``
    or a value), ``rng`` (bool, default True: the global RNG states of Python,
    NumPy, torch and each CUDA device). Raises ``CheckpointError`` naming
    ``state`` (and the key) for anything else, ``directory`` in the message.
    """
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"{directory}: state must be a dict of the training objects, got {state!r}", field="state"
        )
    unknown = sorted(str(key) for key in state if key not in STATE_KEYS)
    if unknown:
        raise CheckpointError(
            f"{directory}: state has unknown key(s) {', '.join(unknown)} (known: {', '.join(STATE_KEYS)})",
            field="state",
        )
    parts = {}
    for name in ("model", "optimizer", "scheduler", "scaler"):
        if state.get(name) is not None:
            if not hasattr(state[name], "state_dict"):
                raise CheckpointError(f"{directory}: state[{name!r}] has no state_dict()", field=f"state.{name}")
            parts[name] = state[name].state_dict()
    position = state.get("data_position")
    if position is not None:
        parts["data_position"] = position.state_dict() if hasattr(position, "state_dict") else position
    generators = state.get("generators") or {}
    if state.get("rng", True) and "torch" in sys.modules:
        from mado_tracking.rng_states import rng_state

        parts.update(rng_parts(rng_state(generators)))
    else:
        parts.update({f"generator.{name}": generator.get_state() for name, generator in generators.items()})
    return training_state(parts, step=step)


def with_training_state(directory, metadata, state, step) -> dict | None:
    """``metadata`` with a ``training_state`` added when one is known (module docstring); ``metadata`` unchanged
    otherwise, or when it is not a dict (``log_checkpoint`` refuses it then) or the state would take more than
    ``MAX_BYTES``."""
    if metadata is not None and (not isinstance(metadata, dict) or "training_state" in metadata):
        return metadata
    if state is not None:
        found = live_training_state(state, step=step, directory=directory)
    else:
        found = read_training_state(directory)
    if found is None or len(json.dumps(found)) > MAX_BYTES:
        return metadata
    return {**(metadata or {}), "training_state": found}
