"""The training-state fingerprint of a checkpoint: which parts of the training state it holds and a SHA-256 of each
(docs/design/checkpoints.md#training-state).

A part's digest is the SHA-256 of a canonical encoding of its state (a
``state_dict()``, an RNG state, a data position): every tensor's dtype, shape
and raw bytes (copied to the CPU), numbers bit for bit, strings, sequences and
mappings (keys sorted), so the state saved and the state of the live object
after ``load_state_dict`` have the same digest exactly when they hold the same
values. Part names: ``model``, ``optimizer``, ``scheduler``, ``scaler``,
``rng.python``, ``rng.numpy``, ``rng.torch``, ``rng.cuda.<i>``,
``generator.<name>``, ``data_position``, ``global_step``.

Importing this module does not import torch; encoding a tensor uses the torch
the caller already imported.
"""

import hashlib
import re
import struct
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from mado_tracking.hashing import hash_threads

FORMAT = 1
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def digest(value) -> str:
    """The hex SHA-256 of ``value``'s canonical encoding (module docstring); equal values give equal digests.

    ``value``: None, bool, int, float, str, bytes, lists / tuples (one kind: a
    tuple and a list of the same items are equal), mappings, torch tensors and
    NumPy arrays or scalars, nested. Anything else is encoded by its type and
    ``repr`` without memory addresses.
    """
    hasher = hashlib.sha256()
    _feed(hasher, value)
    return hasher.hexdigest()


def _sized(hasher, tag: bytes, data: bytes) -> None:
    hasher.update(tag + str(len(data)).encode() + b":")
    hasher.update(data)


def _feed(hasher, value) -> None:
    if value is None:
        hasher.update(b"N")
    elif isinstance(value, bool):
        hasher.update(b"T" if value else b"F")
    elif isinstance(value, int):
        _sized(hasher, b"i", str(value).encode())
    elif isinstance(value, float):
        hasher.update(b"f" + struct.pack("<d", value))
    elif isinstance(value, str):
        _sized(hasher, b"s", value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        _sized(hasher, b"b", bytes(value))
    elif isinstance(value, Mapping):
        items = sorted(value.items(), key=lambda item: (type(item[0]).__name__, repr(item[0])))
        hasher.update(b"d" + str(len(items)).encode() + b":")
        for key, item in items:
            _feed(hasher, key)
            _feed(hasher, item)
    elif isinstance(value, (list, tuple)):
        hasher.update(b"l" + str(len(value)).encode() + b":")
        for item in value:
            _feed(hasher, item)
    elif _is_tensor(value):
        _feed_tensor(hasher, value)
    elif _is_numpy(value):
        import numpy

        array = numpy.ascontiguousarray(value)
        hasher.update(f"a{array.dtype.str}{array.shape}:".encode())
        hasher.update(array.view(numpy.uint8).reshape(-1).data if array.size else b"")
    else:
        _sized(hasher, b"o", f"{type(value).__qualname__}:{_ADDRESS.sub('', repr(value))}".encode())


def _is_tensor(value) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _is_numpy(value) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic))


def _feed_tensor(hasher, tensor) -> None:
    import torch

    tensor = tensor.detach()
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    hasher.update(f"t{tensor.dtype}{tuple(tensor.shape)}:".encode())
    if tensor.device.type == "meta" or tensor.numel() == 0:
        return
    flat = tensor.cpu().contiguous().reshape(-1)
    try:
        data = flat.view(torch.uint8).numpy()
    except (RuntimeError, TypeError):  # no NumPy, or a dtype without a byte view: slower, same bytes
        data = bytes(flat.view(torch.uint8).tolist())
    hasher.update(data)


def rng_parts(rng: Mapping) -> dict[str, object]:
    """``{part name: state}`` of the RNG states ``mado_tracking.torch`` saves (``rng.pt``): ``rng.python``,
    ``rng.numpy`` (when NumPy was there), ``rng.torch``, ``rng.cuda.<i>`` per CUDA device and
    ``generator.<name>`` per named generator."""
    parts = {"rng.python": rng.get("python"), "rng.torch": rng.get("torch")}
    if rng.get("numpy") is not None:
        parts["rng.numpy"] = rng["numpy"]
    for index, state in enumerate(rng.get("cuda") or []):
        parts[f"rng.cuda.{index}"] = state
    for name, state in (rng.get("generators") or {}).items():
        parts[f"generator.{name}"] = state
    return parts


def training_state(states: Mapping[str, object], *, step: int, files: Mapping[str, str] | None = None) -> dict:
    """The ``training_state`` metadata of a checkpoint (docs/design/checkpoints.md#training-state).

    ``states``: ``{part name: state}`` (``rng_parts`` gives the RNG ones);
    ``files``: ``{part name: file}`` relative to the checkpoint directory
    (a part without a file, e.g. a plain ``log_checkpoint(..., state=...)``,
    gets none). ``step``: steps completed (int >= 0).

    Returns ``{"format": 1, "global_step": step, "parts": {part: {"sha256":
    hex, "file": name}}}``, ``global_step`` among the parts. The parts'
    digests run at once on up to ``hashing.hash_threads()`` threads (the model's
    beside the optimizer's; docs/design/checkpoints.md#hash-threads).
    """
    files = files or {}
    named = {**states, "global_step": step}
    threads = min(hash_threads(), len(named))
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mado-fingerprint") as pool:
        digests = dict(zip(named, pool.map(digest, named.values())))
    parts = {}
    for name in named:
        entry = {"sha256": digests[name]}
        if files.get(name):
            entry["file"] = files[name]
        parts[name] = entry
    return {"format": FORMAT, "global_step": step, "parts": parts}
