"""What a resumed program changed between ``load_checkpoint`` and its first training step
(docs/design/checkpoints.md#restore-check).

The load's own check sees the state right after the load; a program can
still change it before training on it: set the learning rate, initialize the
model again, load other weights. So the fingerprint of the restored model,
optimizer and scaler is taken again at the first ``optimizer.step()`` of the
optimizer given to ``load_checkpoint`` (a step pre-hook, removed once it
ran), or at the run's first ``log_metrics`` when that comes first, and
compared with the one at the load:

- the model: a parameter whose values moved (named, the first by name);
  buffers alone moving (batch-norm statistics of a forward pass) is no change;
- the optimizer: a param group's hyperparameter set after the load (``lr``
  …). Where a restored scheduler owns the learning rate, an ``lr`` other than
  the scheduler's last one, or any hyperparameter changed while the
  scheduler did not step, is ``not_restored``; without a scheduler it is
  ``unknown`` (a schedule of the program's own sets it every step). Its state
  (momentum buffers, step counts) changed is ``not_restored``;
- the scaler: its state changed is ``not_restored``.
"""

import copy
from collections.abc import Callable
from pathlib import Path

import torch

from mado_tracking.fingerprint import digest
from mado_tracking.restore_check import NOT_RESTORED, UNKNOWN, Outcome

_FIRST_STEP = "the first optimizer step"
_FIRST_METRICS = "the first metrics (no optimizer step before them)"


class ChangesAfterLoad:
    """The late check of one load (``torch_restore``): called with the first metrics' step, it returns the parts
    changed since the load, taken at the first optimizer step or now, whichever came first."""

    PARTS = ("model", "optimizer", "scaler")

    def __init__(self, directory, live: dict, loaded: dict[str, str], reference: Callable):
        """``live``: ``{part: object}`` restored; ``loaded``: ``{part: digest at the load}`` of the parts to
        compare (``model``, ``optimizer``, ``scaler``); ``reference``: ``torch_restore._reference``."""
        self._model_file = Path(directory) / "model.pt"
        self._objects = {part: reference(live[part]) for part in loaded if live.get(part) is not None}
        self._loaded = loaded
        optimizer, scheduler = live.get("optimizer"), live.get("scheduler")
        self._groups = _hyperparameters(optimizer) if optimizer is not None else None
        self._scheduler = reference(scheduler) if scheduler is not None else None
        self._scheduler_at_load = _scheduler_state(scheduler)
        self._found: Outcome | None = None
        self._handle = None
        if optimizer is not None and hasattr(optimizer, "register_step_pre_hook"):
            self._handle = optimizer.register_step_pre_hook(self._at_step)

    def _at_step(self, _optimizer, _args, _kwargs) -> None:
        self._take(_FIRST_STEP)

    def _take(self, when: str) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self._found is None:
            self._found = self._compare(when)

    def __call__(self, _first) -> Outcome:
        self._take(_FIRST_METRICS)
        return self._found

    def _compare(self, when: str) -> Outcome:
        found = {}
        for part, reference in self._objects.items():
            obj = reference()
            if obj is None or digest(obj.state_dict()) == self._loaded[part]:
                continue  # a dropped object is the "dropped" check's
            if part == "model":
                outcome = self._model_change(obj, when)
            elif part == "optimizer":
                outcome = self._optimizer_change(obj, when)
            else:
                outcome = (NOT_RESTORED, f"its state changed after load_checkpoint, before {when}")
            if outcome is not None:
                found[part] = outcome
        return found

    def _model_change(self, model, when: str):
        try:
            saved = torch.load(self._model_file, map_location="cpu", weights_only=True, mmap=True)
        except (OSError, RuntimeError, ValueError) as error:
            return UNKNOWN, f"its state changed after load_checkpoint, before {when}; not compared ({error})"
        for name, parameter in sorted(model.named_parameters()):
            if name in saved and not torch.equal(parameter.detach().cpu(), saved[name]):
                return (
                    NOT_RESTORED,
                    f"parameter {name} changed after load_checkpoint, before {when} "
                    "(initialized or loaded again after the load?)",
                )
        return None  # buffers only: a forward pass's statistics

    def _optimizer_change(self, optimizer, when: str):
        now = _hyperparameters(optimizer)
        changed = [
            (index, key, before.get(key), after.get(key))
            for index, (before, after) in enumerate(zip(self._groups, now, strict=False))
            for key in sorted(set(before) | set(after))
            if before.get(key) != after.get(key)
        ]
        if not changed:
            return (
                NOT_RESTORED,
                f"its state (momentum buffers, step counts) changed after load_checkpoint, before {when}",
            )
        scheduler = self._scheduler() if self._scheduler is not None else None
        if scheduler is None:
            return UNKNOWN, f"{_said(changed[0], when)} (set after load_checkpoint: a schedule of the program's own?)"
        last = _last_lr(scheduler) or []
        if _scheduler_state(scheduler) != self._scheduler_at_load:  # it stepped: the lr must be the one it set
            changed = [c for c in changed if c[1] == "lr" and c[0] < len(last) and c[3] != last[c[0]]]
            if not changed:
                return None
        index, key = changed[0][:2]
        owner = (
            f", not by the restored scheduler (its lr: {_shown(last[index])})"
            if key == "lr" and index < len(last)
            else ""
        )
        return NOT_RESTORED, f"{_said(changed[0], when)}: set after load_checkpoint{owner}"


def _said(change: tuple, when: str) -> str:
    index, key, before, after = change
    return f"param group {index}: {key} {_shown(before)} at the load, {_shown(after)} at {when}"


def _hyperparameters(optimizer) -> list[dict]:
    return [
        {key: copy.deepcopy(value) for key, value in group.items() if key != "params"}
        for group in optimizer.param_groups
    ]


def _scheduler_state(scheduler):
    if scheduler is None or not hasattr(scheduler, "state_dict"):
        return None
    try:
        return digest(scheduler.state_dict())
    except (TypeError, ValueError):
        return None


def _last_lr(scheduler) -> list | None:
    try:
        return [float(lr) for lr in scheduler.get_last_lr()]
    except (AttributeError, TypeError, ValueError):
        return None


def _shown(value) -> str:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    return f"{value:g}" if isinstance(value, float) else repr(value)
