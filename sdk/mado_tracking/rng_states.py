"""The RNG states a checkpoint of ``mado_tracking.torch`` holds (``rng.pt``), read and set back
(docs/design/checkpoints.md#training-state): Python's ``random``, NumPy's global generator, torch's CPU generator,
every CUDA device's and the named ``torch.Generator``s passed."""

import logging
import random

import torch

try:
    import numpy
except ImportError:  # numpy is optional
    numpy = None

logger = logging.getLogger("mado_tracking")


def rng_state(generators: dict[str, torch.Generator]) -> dict:
    """The RNG states ``save_checkpoint`` writes to ``rng.pt``: ``{"python", "torch", "numpy", "cuda" (a list per
    device, or None), "generators": {name: state}}``."""
    state = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "numpy": None,
        "cuda": None,
        "generators": {name: generator.get_state() for name, generator in generators.items()},
    }
    if numpy is not None:
        legacy = numpy.random.get_state(legacy=False)
        state["numpy"] = {
            "bit_generator": legacy["bit_generator"],
            "pos": int(legacy["state"]["pos"]),
            "key": torch.from_numpy(legacy["state"]["key"].astype(numpy.int64)),
            "has_gauss": int(legacy["has_gauss"]),
            "gauss": float(legacy["gauss"]),
        }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict, generators: dict[str, torch.Generator], directory) -> None:
    """Set the RNGs back to ``state`` (``rng_state``'s) and each of ``generators`` to its saved state; a CUDA device
    count that changed is a warning naming ``directory``, a generator without a saved state a ``ValueError``."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    saved = state.get("numpy")
    if saved is not None and numpy is not None:
        numpy.random.set_state(
            {
                "bit_generator": saved["bit_generator"],
                "has_gauss": saved["has_gauss"],
                "gauss": saved["gauss"],
                "state": {"key": saved["key"].numpy().astype(numpy.uint32), "pos": saved["pos"]},
            }
        )
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if len(cuda) != count:
            logger.warning(
                "mado: %s was saved with %d CUDA devices, %d now; the RNG states of the first %d are restored",
                directory,
                len(cuda),
                count,
                min(len(cuda), count),
            )
        for index, device_state in enumerate(cuda[:count]):
            torch.cuda.set_rng_state(device_state, index)
    for name, generator in generators.items():
        if name not in state.get("generators", {}):
            raise ValueError(
                f"{directory}: no state for generator {name!r} "
                f"(saved: {', '.join(state.get('generators', {})) or 'none'})"
            )
        generator.set_state(state["generators"][name])
