"""What ``mado_tracking.torch.load_checkpoint`` restored, compared with the checkpoint's fingerprint, and the checks
repeated at the first metrics (docs/design/checkpoints.md#restore-check, #training-state).

At the load: each part the checkpoint holds is ``restored`` when the live
object's state now has the checkpoint's digest, ``not_restored`` when the
call left it out (no scheduler given, ``restore_rng=False``, …) or its state
differs; ``not_declared`` for a data position the checkpoint does not hold
(it cannot say where the data stopped). At the first optimizer step, or the
first ``log_metrics`` when it comes first: a value changed after the load
(``mado_tracking.restore_changes``). At the first ``log_metrics`` (one
training step later, so states have moved): a restored object that was dropped since (a model, optimizer,
scheduler, generator or data loader built anew after the load), a learning
rate that is not the one the restored scheduler set, an RNG that drawing
cannot have brought where it is (``mado_tracking.rng_reach``), a data
position that went back, metrics that start below the checkpoint's step.
"""

import random
import weakref
from collections.abc import Mapping

import torch

from mado_tracking import restore_check, rng_reach
from mado_tracking.fingerprint import digest, rng_parts
from mado_tracking.restore_changes import ChangesAfterLoad
from mado_tracking.restore_check import NOT_DECLARED, NOT_RESTORED, RESTORED, UNKNOWN, Outcome
from mado_tracking.rng_states import rng_state

try:
    import numpy
except ImportError:  # numpy is optional
    numpy = None

OBJECT_PARTS = ("model", "optimizer", "scheduler", "scaler", "data_position")
_LEAVES_SHOWN = 4


def check_restored(
    directory, info: dict, *, step: int, live: dict, generators: dict, saved_rng, restore_rng: bool
) -> None:
    """Report what the load of ``directory`` (its ``mado-checkpoint.json`` ``info``) restored into ``live``
    (``{part: object or None}``) and ``generators``; nothing when the process is not resuming."""
    resuming, _checkpoint_id = restore_check.resuming_from(directory)
    if not resuming:
        restore_check.after_load(directory=directory, step=step, parts={})
        return
    expected = _expected_parts(info, saved_rng)
    current = {part: _state_of(obj) for part, obj in live.items() if obj is not None}
    if restore_rng:
        current.update(rng_parts(rng_state(generators)))
    parts = {}
    for part, saved_digest in expected.items():
        if part == "global_step":
            parts[part] = (RESTORED, "")
        elif part not in current:
            parts[part] = (NOT_RESTORED, _why_missing(part, restore_rng))
        elif saved_digest is None or digest(current[part]) == saved_digest:
            parts[part] = (RESTORED, "")
        elif part == "data_position":
            parts[part] = (UNKNOWN, "its state_dict() after load differs from the one saved")
        else:
            parts[part] = (NOT_RESTORED, "its state after load differs from the checkpoint's (converted on load?)")
    if "data_position" not in expected:
        parts["data_position"] = (NOT_DECLARED, _undeclared_position(info))
    restored = {part for part, (status, _detail) in parts.items() if status == RESTORED}
    loaded = {
        part: expected[part] or digest(current[part])
        for part in restored & set(ChangesAfterLoad.PARTS)
        if part in current
    }
    late = [ChangesAfterLoad(directory, live, loaded, _reference), *_late_checks(restored, live, generators, step)]
    restore_check.after_load(directory=directory, step=step, parts=parts, late=late)


def _undeclared_position(info: dict) -> str:
    files = info.get("files") if isinstance(info.get("files"), dict) else {}
    kept = "; if extra.pt keeps it, mado cannot read it there" if "extra" in files else ""
    return (
        f"the checkpoint declares no data position, so where the data resumes is not checked{kept}: declare it "
        "with save_checkpoint(..., data_position=<sampler, loader or value>) and load it with "
        "load_checkpoint(..., data_position=...) or load_data_position()"
    )


def _state_of(obj):
    return obj.state_dict() if hasattr(obj, "state_dict") else obj


def _expected_parts(info: dict, saved_rng) -> dict[str, str | None]:
    """``{part: saved digest, or None when the checkpoint has no fingerprint}``."""
    saved = info.get("training_state")
    parts = saved.get("parts") if isinstance(saved, dict) else None
    if isinstance(parts, dict) and parts:
        return {str(part): entry.get("sha256") if isinstance(entry, dict) else None for part, entry in parts.items()}
    files = info.get("files") if isinstance(info.get("files"), dict) else {}
    expected = dict.fromkeys(part for part in OBJECT_PARTS if part in files)
    if isinstance(saved_rng, Mapping):
        expected.update(dict.fromkeys(rng_parts(saved_rng)))
    expected["global_step"] = None
    return expected


def _why_missing(part: str, restore_rng: bool) -> str:
    if part.startswith(("rng.", "generator.")) and not restore_rng:
        return "load_checkpoint(restore_rng=False)"
    if part.startswith("generator."):
        name = part.split(".", 1)[1]
        return f"the checkpoint holds generator {name!r}; load_checkpoint was given no generator of that name"
    if part.startswith("rng.cuda."):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return f"saved on more CUDA devices than the {count} here"
    if part == "data_position":
        return "the checkpoint holds a data position; load_checkpoint was given none (nor was load_data_position read)"
    if part in OBJECT_PARTS:
        return f"the checkpoint holds a {part} state; load_checkpoint was given no {part}"
    return "the checkpoint holds it; load_checkpoint does not restore it"


def _reference(obj):
    try:
        return weakref.ref(obj)
    except TypeError:  # not weakly referable: kept alive, only its state is checked
        return lambda: obj


def _late_checks(restored: set, live: dict, generators: dict, step: int) -> list:
    checks = [global_step_check(step)]
    for part in ("model", "optimizer", "scaler"):
        if part in restored and live.get(part) is not None:
            checks.append(_dropped_check(part, _reference(live[part])))
    if "scheduler" in restored and live.get("scheduler") is not None:
        checks.append(_scheduler_check(_reference(live["scheduler"])))
    if "data_position" in restored and live.get("data_position") is not None:
        checks.append(_position_check(_reference(live["data_position"]), _leaves(_state_of(live["data_position"]))))
    for part in sorted(restored):
        if part.startswith("rng."):
            reader = _rng_reader(part)
            if reader is not None:
                checks.append(_rng_check(part, *reader))
    for name, generator in generators.items():
        part = f"generator.{name}"
        if part in restored:
            reference = _reference(generator)
            checks.append(_rng_check(part, *_generator_reader(reference), reference))
    return checks


def global_step_check(step: int):
    """The late check of a load at global ``step`` (steps completed): first metrics below it make ``global_step``
    not restored (the loop restarted its count); also used by the framework integrations
    (``mado_tracking.integrations.restore_report``)."""

    def check(first: int | None) -> Outcome:
        if first is None or first >= step:
            return {}
        detail = (
            f"the first metrics are at step {first}, below the checkpoint's step {step}: the loop restarted its count"
        )
        return {"global_step": (NOT_RESTORED, detail)}

    return check


def _dropped_check(part: str, reference):
    def check(_first) -> Outcome:
        if reference() is None:
            return {
                part: (
                    NOT_RESTORED,
                    f"the {part} restored from the checkpoint was dropped before the first "
                    "metrics (built anew after load?)",
                )
            }
        return {}

    return check


def _scheduler_check(reference):
    def check(_first) -> Outcome:
        scheduler = reference()
        if scheduler is None:
            return {
                "scheduler": (
                    NOT_RESTORED,
                    "the scheduler restored from the checkpoint was dropped before the "
                    "first metrics (built anew after load?)",
                )
            }
        try:
            last = [float(lr) for lr in scheduler.get_last_lr()]
            now = [float(group["lr"]) for group in scheduler.optimizer.param_groups]
        except (AttributeError, KeyError, TypeError, ValueError):
            return {}
        if last == now:
            return {}
        return {
            "scheduler": (
                NOT_RESTORED,
                f"the learning rate at the first metrics ({_short(now)}) is not the one "
                f"the restored scheduler set ({_short(last)}): a scheduler built or "
                "stepped after load?",
            )
        }

    return check


def _leaves(value, found=None) -> list:
    """The numbers in ``value`` (a data position's state) in their order, booleans and tensors aside."""
    found = [] if found is None else found
    if isinstance(value, bool):
        return found
    if isinstance(value, (int, float)):
        found.append(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            _leaves(item, found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _leaves(item, found)
    return found


def _position_check(reference, restored: list):
    def check(_first) -> Outcome:
        position = reference()
        if position is None:
            return {
                "data_position": (
                    NOT_RESTORED,
                    "the data loader restored from the checkpoint was dropped before "
                    "the first metrics (built anew after load?)",
                )
            }
        now = _leaves(_state_of(position))
        if len(now) != len(restored):
            return {"data_position": (UNKNOWN, "its state_dict() changed shape since the load: not compared")}
        if tuple(now) < tuple(restored):
            return {
                "data_position": (
                    NOT_RESTORED,
                    f"went back from {_short(restored)} at the load to "
                    f"{_short(now)} at the first metrics (restarted after load?)",
                )
            }
        return {}

    return check


def _short(values: list) -> str:
    shown = ", ".join(f"{value:g}" if isinstance(value, float) else str(value) for value in values[:_LEAVES_SHOWN])
    return shown + (", …" if len(values) > _LEAVES_SHOWN else "")


def _rng_reader(part: str):
    """``(kind, read)`` for a global RNG part, ``read()`` giving its state as ``rng_reach.verdict`` takes it."""
    if part == "rng.python":
        return "mt", lambda: rng_reach.mt_from_python(random.getstate())
    if part == "rng.numpy" and numpy is not None:
        return "mt", lambda: rng_reach.mt_from_numpy(numpy.random.get_state(legacy=False))
    if part == "rng.torch":
        return "mt", lambda: rng_reach.mt_from_torch(bytes(torch.get_rng_state().tolist()))
    if part.startswith("rng.cuda.") and torch.cuda.is_available():
        index = int(part.rsplit(".", 1)[1])
        return "philox", lambda: rng_reach.philox(bytes(torch.cuda.get_rng_state(index).tolist()))
    return None


def _generator_reader(reference):
    def read():
        generator = reference()
        if generator is None:
            return None
        state = bytes(generator.get_state().tolist())
        return rng_reach.philox(state) if generator.device.type == "cuda" else rng_reach.mt_from_torch(state)

    kind = "philox" if reference().device.type == "cuda" else "mt"
    return kind, read


def _rng_check(part: str, kind: str, read, reference=None):
    restored = read()  # right after the load

    def check(_first) -> Outcome:
        if reference is not None and reference() is None:
            return {
                part: (
                    NOT_RESTORED,
                    "the generator restored from the checkpoint was dropped before the first "
                    "metrics (a new one made after load?)",
                )
            }
        status, detail = rng_reach.verdict(kind, restored, read())
        return {} if status == RESTORED else {part: (status, detail)}

    return check
