"""Hugging Face Accelerate through mado: ``accelerator.save_state`` becomes a verified Checkpoint at the loop's
global step, a resumed Run gets it back with ``accelerator.load_state``, the data position included
(docs/integrations.md; docs/design/checkpoints.md#metadata, #save-and-restore; docs/design/resume.md#in-the-code,
#steps-continue; docs/design/runs.md#preemption; docs/design/worker.md#distributed)::

    from accelerate import Accelerator, DataLoaderConfiguration
    from mado_tracking.integrations import accelerate as mado_accelerate

    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    with mado_tracking.start_run(project="vision") as run:   # every process; after Accelerator()
        step = mado_accelerate.load_state(accelerator, run)   # 0, or the checkpoint's step, everything restored
        mado_accelerate.install_preemption(run)
        for batch in mado_accelerate.batches(accelerator, loader):   # resumes mid-epoch where the checkpoint was
            if step >= total:
                break
            with accelerator.accumulate(model):
                ...
            if accelerator.sync_gradients:
                step += 1
                if step % 1000 == 0:
                    mado_accelerate.save_state(accelerator, run, step)
                if mado_accelerate.should_stop(accelerator):
                    mado_accelerate.save_and_exit(accelerator, run, step)

Every process calls every function here at the same point of the loop: ``accelerator.save_state`` runs
collectives under FSDP and DeepSpeed, and each process writes its own RNG state. The main process
(``accelerator.is_main_process``) uploads; the others wait at a barrier until it has snapshotted the directory.

Data position: ``accelerator.save_state`` and ``load_state`` keep the model, optimizer, schedulers, scaler, RNGs,
the step counter of ``accelerator.accumulate`` and registered objects, but where a plain ``DataLoader`` stood in
its epoch only with ``torchdata``'s ``StatefulDataLoader`` (``use_stateful_dataloader``). ``batches`` therefore
counts the epoch and the batches already drawn from it; ``save_state`` writes them to ``mado_data_position.json``
and a resumed ``batches`` starts that epoch again with ``accelerator.skip_first_batches``. The resume is exact
when the order of an epoch depends on the epoch alone: ``DataLoaderConfiguration(use_seedable_sampler=True)``
(the order of epoch ``e`` is drawn from ``seed + e``), no shuffling, or a sampler with ``set_epoch``. A plain
shuffled loader draws its order from the global RNG when the epoch starts, which no checkpoint taken later in
that epoch holds: ``load_state`` says so before training starts. The draw a ``DataLoader`` makes from the global
RNG when its iterator starts is not repeated on the resumed, partial epoch (the checkpoint's RNG state already
holds it). Random augmentation that draws from the global RNG while loading is not replayed for skipped batches.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

from mado_tracking import preemption as preemption_module
from mado_tracking.errors import MadoError
from mado_tracking.integrations.restore_report import report_loaded
from mado_tracking.staging import cache_root, make_read_only

logger = logging.getLogger("mado_tracking")

FRAMEWORK = "accelerate"
POSITION_FILE = "mado_data_position.json"
_STEP_DIR = "step-{}"

# accelerate's file names (accelerate.utils.constants) -> the part of training_state each one holds
_PARTS = (
    (re.compile(r"(?:model|pytorch_model)(?:_(\d+))?\.(?:safetensors|bin)"), "model"),
    (re.compile(r"optimizer(?:_(\d+))?\.bin"), "optimizer"),
    (re.compile(r"scheduler(?:_(\d+))?\.bin"), "scheduler"),
    (re.compile(r"scaler\.pt"), "scaler"),
    (re.compile(r"custom_checkpoint_(\d+)\.pkl"), "registered"),
)


@dataclass
class DataPosition:
    """Where a prepared loader stands: ``epoch`` (0-based) and ``batches`` of it already drawn (this process's)."""

    epoch: int = 0
    batches: int = 0


class _State:
    """What this module keeps per ``Accelerator``: the data positions restored and those ``batches`` counts."""

    def __init__(self):
        self.restored: dict[int, DataPosition] = {}
        self.live: dict[int, DataPosition] = {}


_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_preemption: preemption_module.Preemption | None = None


def _state(accelerator) -> _State:
    state = _states.get(accelerator)
    if state is None:
        state = _states[accelerator] = _State()
    return state


def save_state(accelerator, run, step: int, directory=None, *, wait: bool = False, metadata: dict | None = None):
    """Every process: ``accelerator.save_state`` into ``<directory>/step-<step>``; the main process logs it as the
    Run's checkpoint at ``step`` (framework ``accelerate``; docs/design/checkpoints.md#save-and-restore, #metadata).

    ``step``: the loop's global step, steps completed (int >= 0): a resumed loop goes on from it.
    ``directory``: where the step directory goes (str or path, the same on every process; with several nodes one
    file system they all share, each process writes its RNG state into it); a ``step-<step>`` left there is
    replaced and the files are made read-only, so the snapshot hard-links them. None: a new directory in the main
    process's mado cache (``MMT_CACHE_DIR``, else ``.mado/cache``), removed once mado holds the files.
    ``wait``: False returns once the files are snapshotted and uploads in the background (``run.finish()`` waits);
    True once the checkpoint is complete. ``metadata``: a JSON object kept with the checkpoint; its keys win over
    the ``training_state`` this function writes (what the directory holds, the data position of ``batches``).

    ``run`` is only used on the main process (may be None on the others). Returns, on the main process, what
    ``run.log_checkpoint`` returns (``SavedCheckpoint``, or a ``Future`` of it with ``wait=False``); None on the
    others. Raises ``ValueError`` before anything is written for a bad ``step`` or ``metadata``, when the
    accelerator names its checkpoints itself (``automatic_checkpoint_naming``), or for ``directory`` None on
    several nodes; on the main process the errors of
    ``run.log_checkpoint`` (``CheckpointError``, ``ApiError``, ``MadoError``), after the other processes were let go.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0 (steps completed), got {step!r}")
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError(f"metadata must be a JSON object (a dict), got {type(metadata).__name__}")
    if accelerator.project_configuration.automatic_checkpoint_naming:
        raise ValueError(
            "accelerator: ProjectConfiguration(automatic_checkpoint_naming=True) makes save_state ignore the "
            "directory it is given; turn it off (mado keeps the checkpoints)"
        )
    main = accelerator.is_main_process
    if main and run is None:
        raise ValueError("run: the main process needs the Run to log the checkpoint to (start_run's result)")
    managed = directory is None
    if managed and accelerator.num_processes > int(os.environ.get("LOCAL_WORLD_SIZE", accelerator.num_processes)):
        raise ValueError("directory: with several nodes, pass a directory on a file system every node shares")
    target = _step_directory(accelerator, directory, step)
    if main and target.exists():
        shutil.rmtree(target)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(target))
    state = _state(accelerator)
    if main and state.live:
        positions = {str(index): asdict(position) for index, position in sorted(state.live.items())}
        (target / POSITION_FILE).write_text(json.dumps({"loaders": positions}), encoding="utf-8")
    accelerator.wait_for_everyone()  # every process's files are written
    saved = None
    try:
        if main:
            make_read_only(target)
            training_state = _training_state(accelerator, target, step, state)
            combined = {"training_state": training_state, **(metadata or {})}
            includes_optimizer = any(name.startswith("optimizer") for name in training_state["parts"])
            saved = run.log_checkpoint(
                target,
                step,
                includes_optimizer=includes_optimizer,
                framework=FRAMEWORK,
                wait=wait,
                metadata=combined,
            )
    finally:
        if main and managed:
            shutil.rmtree(target.parent, ignore_errors=True)  # mado holds the files (a snapshot, or uploaded)
        accelerator.wait_for_everyone()  # nobody writes the next save before the main process snapshotted this one
    return saved


def load_state(accelerator, run) -> int:
    """Every process, after ``accelerator.prepare``: restore the checkpoint this Run resumes from
    (``run.resume_checkpoint()``, docs/design/resume.md#in-the-code) with ``accelerator.load_state``; return its step
    (steps completed: continue the loop from there, docs/design/resume.md#steps-continue), or 0 when not resuming.

    Every process asks its own ``run`` (``start_run`` on every process: under torchrun rank 0 finds the checkpoint
    and the others get the same one, on their node); all of them must find the same step.
    ``accelerator.load_state`` only reads the directory, which a Job's worker extracts read-only, as does a same-run
    resume into the cache. Before training starts it warns (logger ``mado_tracking``) when the checkpoint cannot
    put the data back where it was: no data position recorded (the loop did not iterate with ``batches``), a
    mid-epoch position of a loader whose epoch order comes from the global RNG, or no RNG state for this process
    (a different number of processes).

    The main process then sends the restore report (docs/integrations.md, "What a resume restored"): every part
    the directory holds that the accelerator had an object for, its RNG state, the data position ``batches``
    recorded, the global step.

    Raises ``ValueError`` when no model was prepared yet or ``run`` is None; what ``run.resume_checkpoint()``
    raises (``ResumeError``, ``CheckpointError``, ``ApiError``) on the process it failed on and ``MadoError``
    naming it on the others, also when the processes found different steps; what ``accelerator.load_state``
    raises for a checkpoint of another layout.
    """
    if not getattr(accelerator, "_models", None):
        raise ValueError("accelerator: call accelerator.prepare(model, optimizer, ...) before load_state")
    checkpoint = _shared_resume_checkpoint(accelerator, run)
    state = _state(accelerator)
    state.restored.clear()
    if checkpoint is None:
        return 0
    path, step, checkpoint_id = checkpoint
    path = Path(path)
    if not (path / f"random_states_{accelerator.process_index}.pkl").is_file():
        logger.warning(
            "mado: checkpoint %s holds no RNG state of process %d (it was saved by fewer processes): dropout and "
            "shuffling will not repeat an uninterrupted run's",
            checkpoint_id,
            accelerator.process_index,
        )
    accelerator.load_state(str(path))
    state.restored = _read_positions(path)
    position = _warn_unrestorable(accelerator, state.restored, path)
    if accelerator.is_main_process:
        _report(accelerator, path, step, state, position)
    logger.info("mado: resumed from checkpoint %s at step %d (%s)", checkpoint_id, step, path)
    return step


def batches(accelerator, loader, *, epochs: int | None = None):
    """Every process: the batches of the prepared ``loader``, epoch after epoch, starting where the checkpoint
    ``load_state`` restored left it (docs/integrations.md, "Accelerate").

    Sets the loader's epoch before each one (``loader.set_epoch``), skips the batches of a resumed epoch already
    trained on (``accelerator.skip_first_batches``; a ``StatefulDataLoader`` resumes by itself) and counts what it
    yields for ``save_state``. Called again for the same loader, it goes on where the previous one stopped.
    ``epochs``: stop after that many epochs in all (counted from epoch 0, the resumed ones included); None: never
    (break out of the loop). Stops when an epoch yields nothing.

    Raises ``ValueError`` (at the first ``next``) when ``loader`` did not go through ``accelerator.prepare``.
    """
    import torch

    index = _loader_index(accelerator, loader)
    state = _state(accelerator)
    start = state.restored.pop(index, None) or state.live.get(index) or DataPosition()
    position = _normalised(DataPosition(start.epoch, start.batches), loader)
    stateful = bool(getattr(loader, "use_stateful_dataloader", False))
    while epochs is None or position.epoch < epochs:
        skip = 0 if stateful else position.batches
        if not stateful and hasattr(loader, "set_epoch"):
            loader.set_epoch(position.epoch)
        source = accelerator.skip_first_batches(loader, skip) if skip else loader
        live = state.live[index] = DataPosition(position.epoch, position.batches)
        iterator = iter(source)
        yielded = 0
        while True:
            # the first fetch of a resumed epoch: the loader's start-of-epoch RNG draw is in the restored state already
            rng = torch.get_rng_state() if position.batches and yielded == 0 else None
            try:
                batch = next(iterator)
            except StopIteration:
                break
            finally:
                if rng is not None:
                    torch.set_rng_state(rng)
            yielded += 1
            live.batches += 1
            yield batch
        if yielded == 0 and position.batches == 0:
            return
        position = DataPosition(position.epoch + 1, 0)
        state.live[index] = DataPosition(position.epoch, 0)


def data_position(accelerator, loader) -> DataPosition:
    """Where ``batches`` stands in the prepared ``loader`` (a copy), or where a resumed one will start; epoch 0,
    batch 0 before either. Raises ``ValueError`` when ``loader`` did not go through ``accelerator.prepare``."""
    index = _loader_index(accelerator, loader)
    state = _state(accelerator)
    found = state.live.get(index) or state.restored.get(index) or DataPosition()
    return DataPosition(found.epoch, found.batches)


def install_preemption(run) -> preemption_module.Preemption:
    """Every process, once (from the main thread): ``mado_tracking.preemption.install(run)``; a second call
    returns the same ``Preemption`` (docs/design/runs.md#preemption). Raises ``ValueError`` off the main thread."""
    global _preemption
    if _preemption is None:
        _preemption = preemption_module.install(run)
    elif run is not None:
        _preemption.run = run
    return _preemption


def should_stop(accelerator) -> bool:
    """Every process, at the same step boundary: True on all of them once any got a stop signal (one all-reduce
    when distributed, ``Preemption.agreed``); False before ``install_preemption``."""
    return _preemption is not None and _preemption.agreed()


def save_and_exit(accelerator, run, step: int, directory=None) -> None:
    """Every process, once ``should_stop`` said so: ``save_state(..., wait=True)`` with the signal in the
    checkpoint's metadata (the main process returns once it is complete), then exit with 128 + the signal number
    so the Run ends ``preempted`` (docs/design/runs.md#preemption). Raises ``MadoError`` without a stop signal
    (nothing saved)."""
    if _preemption is None or not _preemption.requested:
        raise MadoError("save_and_exit: no stop signal arrived (call install_preemption, then should_stop)")
    save_state(accelerator, run, step, directory, wait=True, metadata=_preemption.metadata())
    if accelerator.is_main_process:
        logger.warning("mado: %s: saved step %d, exiting as preempted", _preemption.signal_name, step)
    _preemption.exit()


def _step_directory(accelerator, directory, step: int) -> Path:
    """``<directory>/step-<step>``; without ``directory`` a new one in the mado cache, the same on every process."""
    if directory is None:
        root = None
        if accelerator.is_main_process:
            cache = cache_root() / "accelerate"
            cache.mkdir(parents=True, exist_ok=True)
            root = str(Path(tempfile.mkdtemp(prefix="save-state-", dir=cache)).resolve())
        directory = _from_main(accelerator, root)
    return Path(directory) / _STEP_DIR.format(step)


def _from_main(accelerator, value):
    """The main process's ``value`` on every process."""
    if accelerator.num_processes == 1:
        return value
    from accelerate.utils import broadcast_object_list

    box = [value]
    broadcast_object_list(box, from_process=0)
    return box[0]


def _shared_resume_checkpoint(accelerator, run):
    """``(path, step, id)`` of this process's ``run.resume_checkpoint()``, or None.

    Every process asks its own Run handle: under torchrun the SDK has rank 0 find the checkpoint and the others
    get the same one, fetched into their node's cache when rank 0's directory is not on their machine. Every process
    raises when one of them failed or they found different steps, so none trains from another state.
    """
    found, failure, answer = None, None, None
    try:
        if run is None:
            raise ValueError("run: every process needs its Run to resume (start_run on every process)")
        found = run.resume_checkpoint()
        answer = None if found is None else found.step
    except Exception as error:  # every process must hear of it, or the others would wait for ever
        failure, answer = error, f"{type(error).__name__}: {error}"
    if accelerator.num_processes == 1:
        answers = [answer]
    else:
        from accelerate.utils import gather_object

        answers = gather_object([answer])
    if failure is not None:
        raise failure
    errors = [answer for answer in answers if isinstance(answer, str)]
    if errors:
        raise MadoError(f"process {accelerator.process_index}: another process could not resume: {errors[0]}")
    if len(set(answers)) > 1:
        shown = ", ".join(f"process {index}: {answer}" for index, answer in enumerate(answers))
        raise MadoError(f"the processes found different checkpoints to resume from (steps {shown})")
    return None if found is None else (str(found.path), found.step, found.id)


def _loader_index(accelerator, loader) -> int:
    for index, prepared in enumerate(getattr(accelerator, "_dataloaders", [])):
        if prepared is loader:
            return index
    raise ValueError("loader: pass the DataLoader that accelerator.prepare returned")


def _normalised(position: DataPosition, loader) -> DataPosition:
    """A position at the end of an epoch is the start of the next one."""
    try:
        length = len(loader)
    except TypeError:
        return position
    if length and position.batches >= length:
        return DataPosition(position.epoch + 1, 0)
    return position


def _read_positions(path: Path) -> dict[int, DataPosition]:
    try:
        loaders = json.loads((path / POSITION_FILE).read_text(encoding="utf-8"))["loaders"]
        return {int(index): DataPosition(int(p["epoch"]), int(p["batches"])) for index, p in loaders.items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        logger.warning("mado: %s: unreadable (%s); the data starts from epoch 0", path / POSITION_FILE, error)
        return {}


def _warn_unrestorable(accelerator, restored: dict[int, DataPosition], path: Path) -> dict[str, str]:
    """Say before training what of the data position this checkpoint cannot restore; ``{"data_position": why}``
    for a position it holds but cannot restore, else ``{}``."""
    loaders = list(getattr(accelerator, "_dataloaders", []))
    if not loaders or not accelerator.is_main_process:
        return {}
    if not restored and not (path / "dl_state_dict.bin").exists():
        logger.warning(
            "mado: the checkpoint records no data position (the loop did not iterate with "
            "mado_tracking.integrations.accelerate.batches): every loader starts again at epoch 0, batch 0. Iterate "
            "with batches(accelerator, loader), or skip what was trained on with accelerator.skip_first_batches"
        )
        return {}
    from torch.utils.data import RandomSampler

    for index, position in sorted(restored.items()):
        loader = loaders[index] if index < len(loaders) else None
        if loader is None or position.batches == 0 or getattr(loader, "use_stateful_dataloader", False):
            continue
        sampler = loader.get_sampler() if hasattr(loader, "get_sampler") else getattr(loader, "sampler", None)
        if isinstance(sampler, RandomSampler) and type(sampler).__name__ != "SeedableRandomSampler":
            logger.warning(
                "mado: loader %d resumes in epoch %d after %d batches, but its shuffled order was drawn from the "
                "global RNG when that epoch started: the skipped batches are not the ones trained on, and the rest "
                "of the epoch differs from an uninterrupted run. Use "
                "Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True)) for an exact "
                "resume",
                index,
                position.epoch,
                position.batches,
            )
            return {
                "data_position": f"loader {index}'s shuffled order came from the global RNG at the start of epoch "
                f"{position.epoch}: use DataLoaderConfiguration(use_seedable_sampler=True)"
            }
    return {}


def _report(accelerator, path: Path, step: int, state: _State, position: dict[str, str]) -> None:
    """The restore report of ``accelerator.load_state(path)``: it loaded the file of each model, optimizer,
    scheduler and the scaler the accelerator holds an object for, and the main process's RNG state (the RNG parts
    of ``_training_state`` are those of ``random_states_0.pkl``)."""
    holds = _training_state(accelerator, path, step, state)["parts"]
    objects = {
        "model": len(accelerator._models),
        "optimizer": len(accelerator._optimizers),
        "scheduler": len(accelerator._schedulers),
        "scaler": int(accelerator.scaler is not None),
    }
    not_loaded = dict(position)
    for part in holds:
        kind, _, number = part.partition(".")
        if kind in objects and int(number or 0) >= objects[kind]:
            not_loaded[part] = f"the checkpoint holds it; accelerator.prepare was given {objects[kind]} {kind}(s)"
    report_loaded(
        path,
        step=step,
        holds=holds,
        not_loaded=not_loaded,
        declare_position="iterate with mado_tracking.integrations.accelerate.batches(accelerator, loader), so "
        "save_state records the data position",
    )


def _training_state(accelerator, target: Path, step: int, state: _State) -> dict:
    """``training_state`` of the checkpoint metadata: the parts the directory holds and the file of each."""
    parts: dict[str, dict] = {}
    names = sorted(p.name for p in target.iterdir() if p.is_file())
    for name in names:
        for pattern, part in _PARTS:
            match = pattern.fullmatch(name)
            if match:
                number = match.group(1) if match.groups() else None
                key = f"{part}.{number or 0}" if part == "registered" else f"{part}.{number}" if number else part
                parts.setdefault(key, {"file": name})
                break
    rng = "random_states_0.pkl"
    if rng in names:
        kinds = ["python", "numpy", "torch"]
        if accelerator.device.type != "cpu":
            kinds.append(accelerator.device.type)
        for kind in kinds:
            parts[f"rng.{kind}"] = {"file": rng}
    if POSITION_FILE in names:
        loaders = {str(index): asdict(position) for index, position in sorted(state.live.items())}
        parts["data_position"] = {"file": POSITION_FILE, "loaders": loaders}
    elif "dl_state_dict.bin" in names:
        parts["data_position"] = {"file": "dl_state_dict.bin"}
    return {"parts": parts, "global_step": step, "processes": accelerator.num_processes}
