"""Save and restore everything a PyTorch training loop needs to continue bit for bit (docs/design/resume.md#in-the-code;
docs/design/interfaces.md#example-program).

    from mado_tracking.torch import load_checkpoint, save_checkpoint

    checkpoint = run.resume_checkpoint()
    start = load_checkpoint(checkpoint.path, model=model, optimizer=optimizer) if checkpoint else 0
    for step in range(start, total):
        ...
        if (step + 1) % every == 0:
            save_checkpoint("ckpt", model=model, optimizer=optimizer, step=step + 1)
            run.log_checkpoint("ckpt", step=step + 1, includes_optimizer=True, framework="torch")

A checkpoint directory holds ``model.pt``, ``optimizer.pt``, ``scheduler.pt``,
``scaler.pt`` (each when given), ``rng.pt`` (Python ``random``, NumPy's global
generator, torch's CPU generator, every CUDA device's generator when CUDA is
available, and the ``generators`` you pass, e.g. the one that draws batches),
``data_position.pt`` (a sampler's or stateful data loader's ``state_dict``, or a
value you pass), ``extra.pt`` (when given) and ``mado-checkpoint.json`` (step,
file list and the training-state fingerprint, docs/design/checkpoints.md#training-state:
``run.log_checkpoint`` sends it as the checkpoint's ``training_state``).
``load_checkpoint`` of a resumed run compares what it restored with that
fingerprint and says what was not restored before the first step
(``mado_tracking.restore_check``, docs/design/checkpoints.md#restore-check).
Everything is written with ``torch.save`` and read back with
``torch.load(weights_only=True)``: no pickled code runs on load. Each file is
written under a temporary name, made read-only and renamed into place, so
``run.log_checkpoint(dir, step, wait=False)`` snapshots it with a hard link
(no copy) and the next save never changes a snapshot still uploading.

A save first removes ``mado-checkpoint.json`` (written again last) and each
previous file right before writing its successor: the pages the old file
held are free again for the new one, instead of the kernel finding a fresh
gigabyte for every gigabyte written (docs/deploy.md, "Measured"). A save that is interrupted
leaves no ``mado-checkpoint.json``, so ``load_checkpoint`` refuses the
directory rather than mixing files of two saves; a snapshot taken earlier
keeps its own hard links and is not affected.

Sharded checkpoints of a torchrun program (``torch.distributed.checkpoint``,
docs/design/worker.md#distributed): ``save_distributed`` / ``load_distributed`` and
``run.log_checkpoint_distributed``, from ``mado_tracking.dcp``.
"""

import json
import logging
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from mado_tracking import restore_check
from mado_tracking.fingerprint import rng_parts, training_state
from mado_tracking.rng_states import rng_state, set_rng_state
from mado_tracking.torch_restore import check_restored

logger = logging.getLogger("mado_tracking")

INFO_FILE = "mado-checkpoint.json"
FILES = {
    "model": "model.pt",
    "optimizer": "optimizer.pt",
    "scheduler": "scheduler.pt",
    "scaler": "scaler.pt",
    "rng": "rng.pt",
    "data_position": "data_position.pt",
    "extra": "extra.pt",
}
STATE_PARTS = ("model", "optimizer", "scheduler", "scaler", "data_position")
FORMAT = 1

__all__ = [
    "load_checkpoint",
    "load_distributed",  # noqa: F822 - provided by __getattr__
    "load_data_position",
    "load_extra",
    "rng_state",
    "save_checkpoint",
    "save_distributed",  # noqa: F822 - provided by __getattr__
]


def __getattr__(name: str):
    """``save_distributed`` / ``load_distributed`` come from ``mado_tracking.dcp`` on first use: importing
    ``torch.distributed.checkpoint`` is slow, and a one-process program need not pay for it."""
    if name in ("load_distributed", "save_distributed"):
        from mado_tracking import dcp

        return getattr(dcp, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def save_checkpoint(
    directory,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler=None,
    step: int,
    extra=None,
    generators: dict[str, torch.Generator] | None = None,
    scaler=None,
    data_position=None,
) -> Path:
    """Write the training state into ``directory`` (created if needed); return it as a ``Path``
    (docs/design/checkpoints.md#training-state).

    Args:
        directory: where to write; files of an earlier save there are removed
            and written anew (``mado-checkpoint.json`` last), and one this save
            does not write (``optimizer.pt`` …) is removed.
        model: its ``state_dict()`` goes to ``model.pt``.
        optimizer: its ``state_dict()`` (momentum buffers, …) to ``optimizer.pt``.
        scheduler: an LR scheduler; its ``state_dict()`` to ``scheduler.pt``.
        step: steps completed (int >= 0); ``load_checkpoint`` returns it.
        extra: anything ``torch.load(weights_only=True)`` can read back
            (tensors, numbers, str, lists, dicts) to ``extra.pt``.
        generators: ``{name: torch.Generator}`` whose states are saved beside
            the global RNG states.
        scaler: a gradient scaler (``torch.amp.GradScaler``); its ``state_dict()`` to ``scaler.pt``.
        data_position: where the data loader is: an object with ``state_dict()``
            (a sampler, a stateful data loader) or a value ``torch.load(weights_only=True)``
            reads back (an int, a dict of ints and tensors), to ``data_position.pt``.

    ``mado-checkpoint.json`` also gets the ``training_state`` fingerprint:
    a SHA-256 of each part's state (every tensor read once more, on the CPU).

    Raises:
        ValueError: a negative or non-int ``step``.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0 (steps completed), got {step!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    states = {"model": model.state_dict(), "rng": rng_state(generators or {})}
    for part, given in (("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler)):
        if given is not None:
            states[part] = given.state_dict()
    if data_position is not None:
        states["data_position"] = data_position.state_dict() if hasattr(data_position, "state_dict") else data_position
    if extra is not None:
        states["extra"] = extra
    (directory / INFO_FILE).unlink(missing_ok=True)  # the directory is incomplete until it is written again
    fingerprinted = {part: states[part] for part in STATE_PARTS if part in states}
    rng = rng_parts(states["rng"])
    # The fingerprint reads every tensor once more: on a thread of its own (hashlib releases the GIL) it runs
    # while torch.save writes the files, so the training loop waits for the longer of the two, not their sum.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mado-fingerprint") as pool:
        fingerprint = pool.submit(
            training_state,
            {**fingerprinted, **rng},
            step=step,
            files={**{p: FILES[p] for p in fingerprinted}, **dict.fromkeys(rng, FILES["rng"])},
        )
        for part, name in FILES.items():
            path = directory / name
            path.unlink(missing_ok=True)  # before the write: its pages serve the new file (module docstring)
            if part in states:
                _write_replacing(path, lambda temporary, state=states[part]: torch.save(state, temporary))
        info = {"format": FORMAT, "step": step, "files": {part: FILES[part] for part in states}}
        info["torch"] = torch.__version__
        info["training_state"] = fingerprint.result()
    text = json.dumps(info, indent=2, sort_keys=True) + "\n"
    _write_replacing(directory / INFO_FILE, lambda temporary: temporary.write_text(text, encoding="utf-8"))
    return directory


def _write_replacing(path: Path, write) -> None:
    # A new read-only file renamed into place, never a rewrite in place: a background save
    # (log_checkpoint(wait=False)) hard-links read-only files instead of copying them.
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(temporary)
        os.chmod(temporary, 0o444)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def load_checkpoint(
    directory,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler=None,
    generators: dict[str, torch.Generator] | None = None,
    map_location="cpu",
    restore_rng: bool = True,
    scaler=None,
    data_position=None,
) -> int:
    """Restore what ``save_checkpoint`` wrote into the given objects and the RNGs; return the step
    (docs/design/checkpoints.md#restore-check).

    ``model``, ``optimizer``, ``scheduler``, ``scaler`` and ``data_position``
    (an object with ``load_state_dict``) get their ``load_state_dict``;
    with ``restore_rng`` the global RNG states (Python, NumPy, torch CPU,
    CUDA when available) and each named generator in ``generators`` are set
    back, so the next random numbers are those the saved run would have
    drawn. ``map_location`` as in ``torch.load`` (tensors land on the CPU by
    default; ``load_state_dict`` copies them to the parameters' devices).

    In a resumed run (``run.resume_checkpoint()``'s directory) the restored
    objects are then compared with the checkpoint's fingerprint: a part the
    checkpoint holds but this call did not restore (no scheduler given,
    ``restore_rng=False``, a generator or the data position left out) is
    named in a WARNING line and sent to the server as the run's restore
    report, and checked again at the first optimizer step (a value changed
    after this call, such as the learning rate: ``mado_tracking.restore_changes``)
    and the first ``log_metrics`` (a scheduler rebuilt, an RNG re-seeded, a
    loader restarted after this call; ``mado_tracking.restore_check``). A
    checkpoint that holds no data position reports it ``not_declared``,
    naming ``save_checkpoint(..., data_position=...)``.

    Raises:
        FileNotFoundError: ``directory`` holds no ``mado-checkpoint.json``.
        ValueError: an optimizer, scheduler, scaler, data position or
            generator was passed but the checkpoint has no state for it.
    """
    directory = Path(directory)
    info = json.loads((directory / INFO_FILE).read_text(encoding="utf-8"))
    files = info.get("files", {})

    def load(part: str):
        if part not in files:
            raise ValueError(f"{directory}: the checkpoint holds no {part} state ({', '.join(files)} only)")
        return torch.load(directory / files[part], map_location=map_location, weights_only=True)

    model.load_state_dict(load("model"))
    given = {"optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}
    for part, target in given.items():
        if target is not None:
            target.load_state_dict(load(part))
    if data_position is not None:
        if not hasattr(data_position, "load_state_dict"):
            raise ValueError("data_position must have load_state_dict(); read a saved value with load_data_position")
        data_position.load_state_dict(load("data_position"))
    saved_rng = load("rng") if "rng" in files else None
    if restore_rng:
        set_rng_state(saved_rng if saved_rng is not None else load("rng"), generators or {}, directory)
    step = int(info["step"])
    check_restored(
        directory,
        info,
        step=step,
        live={"model": model, **given, "data_position": data_position},
        generators=generators or {},
        saved_rng=saved_rng,
        restore_rng=restore_rng,
    )
    return step


def load_data_position(directory, *, map_location="cpu"):
    """The ``data_position`` value saved with the checkpoint in ``directory``, or None when there was none; in a
    resumed run the data position then counts as restored (docs/design/checkpoints.md#restore-check)."""
    path = Path(directory) / FILES["data_position"]
    if not path.exists():
        return None
    restore_check.mark("data_position", restore_check.RESTORED)
    return torch.load(path, map_location=map_location, weights_only=True)


def load_extra(directory, *, map_location="cpu"):
    """The ``extra`` object saved with the checkpoint in ``directory``, or None when there was none."""
    path = Path(directory) / FILES["extra"]
    return torch.load(path, map_location=map_location, weights_only=True) if path.exists() else None
