"""Preemption that really saves: a stop signal becomes a flag the training loop checks, then a checkpoint, then an
exit the scheduler reads as a preemption (docs/design/runs.md#preemption).

A cluster tells a job to stop with a signal some seconds before it kills it: SLURM sends SIGTERM (or the
signal of ``--signal=USR1@120``), Kubernetes SIGTERM then SIGKILL after ``terminationGracePeriodSeconds``,
a spot VM's agent SIGTERM. Saving from inside a signal handler is unsafe (the handler interrupts the
training step anywhere, a CUDA call or a half-built optimizer state included), so the handler only records
the signal; the loop saves at the next step boundary::

    from mado_tracking import preemption

    stop = preemption.install(run)          # SIGTERM and SIGUSR1, from the main thread
    for step in range(start, total):
        train_one_step()
        if stop.requested:                  # under torchrun: stop.agreed(), every rank calls it
            save_checkpoint("ckpt", model=model, optimizer=optimizer, step=step + 1)
            run.log_checkpoint("ckpt", step=step + 1, metadata=stop.metadata())   # waits until complete
            stop.exit()                     # mark_preempting + exit 128 + signal number

The handler tells the server at once (``run.mark_preempting()``), so the Run ends ``preempted`` (a sweep
requeues it) however the process ends. ``metadata()`` records the signal and its time in the checkpoint
(docs/design/checkpoints.md#metadata): the server answers the seconds from the signal to ``complete``.
The framework integrations (``mado_tracking.integrations``) check the flag themselves.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

logger = logging.getLogger("mado_tracking")

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preemption:
    """What the installed handler saw: ``requested`` (bool), ``signum`` (int or None), ``signal_name``
    ("SIGTERM" …), ``signal_at`` (seconds since the epoch) and ``run`` (told with ``mark_preempting``)."""

    def __init__(self, run=None):
        self.run = run
        self.signum: int | None = None
        self.signal_at: float | None = None
        self._previous: dict[int, object] = {}
        self._delivered = False  # a signal reached this process's handler (not only another rank's, via agreed)
        self._last_vote = None  # the latest all-reduce's Work, see agreed()

    @property
    def requested(self) -> bool:
        """True once a stop signal arrived in this process."""
        return self.signum is not None

    @property
    def signal_name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def agreed(self) -> bool:
        """Under an initialised ``torch.distributed`` process group: True on every rank once any rank got a
        signal (one all-reduce; every rank must call it at the same step). Else ``requested``."""
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            return self.requested
        if not (dist.is_available() and dist.is_initialized()):
            return self.requested
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([1 if self.requested else 0], device=device)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
        work.wait()
        # Held until the next vote, so the process group's worker thread never drops the last reference to
        # ``flag``: that drop takes the GIL, and a gloo group's destructor joins its threads holding the GIL
        # (at exit, right after the last vote, the process hung there).
        self._last_vote = work
        if flag.item() and not self.requested:
            self._record(signal.SIGTERM)  # another rank was told; this one stops with it
        return bool(flag.item())

    def metadata(self) -> dict:
        """``{"preemption": {"signal", "signal_at"}}`` for ``log_checkpoint(metadata=...)``; ``{}`` before a
        signal (docs/design/checkpoints.md#metadata)."""
        if not self.requested:
            return {}
        return {"preemption": {"signal": self.signal_name, "signal_at": self.signal_at}}

    def exit(self) -> None:
        """Mark the Run preempting and leave with status 128 + the signal number (143 for SIGTERM), what a
        shell reports for a process killed by that signal.

        Goes through ``sys.exit`` so the SDK's exit hook sees the code and ends the Run ``preempted``.
        Raises ``RuntimeError`` when no signal arrived.
        """
        if not self.requested:
            raise RuntimeError("no stop signal arrived: nothing to exit for")
        if self.run is not None:
            self.run.mark_preempting()
        sys.exit(128 + self.signum)

    def uninstall(self) -> None:
        """Put back the handlers that were there before ``install``."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _record(self, signum: int) -> None:
        if self.signum is None:
            self.signum, self.signal_at = signum, time.time()

    def _handle(self, signum, frame) -> None:
        if self._delivered:
            self._die_of(signum)  # a second signal: the process may be stuck where the flag is never read
        self._delivered = True
        self._record(signum)
        if self.run is not None:
            self.run.mark_preempting()  # safe in a handler: a short PATCH on its own connection, never raises
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)

    def _die_of(self, signum: int) -> None:
        """End the process as the signal's default action would: a launcher (torchrun, srun) that signals
        twice, or a user pressing twice, must be obeyed even when the loop is blocked in a collective whose
        peers are gone and never reaches its next step."""
        logger.warning("mado: second %s before the checkpoint was saved: exiting now", signal.Signals(signum).name)
        self.uninstall()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install(run=None, *, signals=DEFAULT_SIGNALS) -> Preemption:
    """Record the first of ``signals`` (default SIGTERM and SIGUSR1) instead of dying of it; return the
    ``Preemption`` the training loop checks (see the module docstring).

    ``run``: the Run to ``mark_preempting()`` when the signal arrives (None: only the flag). A handler a
    framework installed before is still called after this one records the signal.

    Raises ``ValueError`` when called outside the main thread (Python delivers signals to it only).
    """
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("preemption.install must be called from the main thread (signals are delivered there)")
    preemption = Preemption(run)
    for signum in signals:
        previous = signal.signal(signum, preemption._handle)
        preemption._previous[signum] = previous
    logger.info(
        "mado: on %s this process saves at the next step and exits as preempted",
        ", ".join(signal.Signals(s).name for s in signals),
    )
    return preemption
