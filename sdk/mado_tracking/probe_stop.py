"""The SDK's side of ``mado probe-resume`` (docs/design/checkpoints.md#probe): stop a Job's code at a given step, so
that any training loop logging through the SDK can be interrupted and resumed without a change to its code.

``mado probe-resume`` launches Jobs with two Run parameters the SDK reads at
the Run's ``log_metrics``:

- ``mado_probe_fail_at_step`` (int >= 0): when the code logs metrics at that
  step or later, the Run's metrics and checkpoint uploads are drained, the
  Run ends ``failed`` and the process exits with 1: the steps before it are
  logged, nothing of that step is. Honoured only in a Job that starts afresh
  (``MMT_START_KIND=new``): the resumed Job copies its parent's parameters
  and must run on.
- ``mado_probe_end_at_step`` (int >= 0): the same at that step, but the Run
  ends ``finished`` and the process exits with 0 (every Job of a probe stops
  at the same step).

Any other value is ignored. Offline Runs and ranks other than 0 ignore both.
"""

import logging
import os
import sys

logger = logging.getLogger("mado_tracking")

FAIL_AT_STEP = "mado_probe_fail_at_step"
END_AT_STEP = "mado_probe_end_at_step"
EXIT_FAILED = 1
_UNSET = object()


def _step(value) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def plan(run) -> tuple[int | None, int | None] | None:
    """``(fail at, end at)`` for ``run`` from its parameters, or None when neither applies."""
    if getattr(run, "offline", False) or getattr(run, "rank", 0) != 0:
        return None
    parameters = getattr(run, "parameters", None) or {}
    fail_at = _step(parameters.get(FAIL_AT_STEP)) if os.environ.get("MMT_START_KIND") == "new" else None
    end_at = _step(parameters.get(END_AT_STEP))
    return None if fail_at is None and end_at is None else (fail_at, end_at)


def check(run, step) -> None:
    """Stop the process when ``run``'s probe plan says so for a ``log_metrics`` at ``step`` (None: ``run.step``)."""
    found = run.__dict__.get("_probe_plan", _UNSET)
    if found is _UNSET:
        found = run.__dict__["_probe_plan"] = plan(run)
    if found is None:
        return
    step = run.step if step is None else step
    if isinstance(step, bool) or not isinstance(step, int):
        return
    fail_at, end_at = found
    if fail_at is not None and step >= fail_at:
        _stop(run, "failed", EXIT_FAILED, f"mado probe: stopping at step {step} as asked ({FAIL_AT_STEP}={fail_at})")
    if end_at is not None and step >= end_at:
        _stop(run, "finished", 0, f"mado probe: ending at step {step} as asked ({END_AT_STEP}={end_at})")


def _stop(run, status: str, code: int, message: str) -> None:
    print(message, flush=True)
    try:
        run.finish(status)
    except Exception as error:  # noqa: BLE001 - exiting anyway; say why the Run may stay open
        logger.error("mado: finishing run %s: %s", run.id, error)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
