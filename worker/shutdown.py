"""The worker's own stop reaches the running Job's code (docs/design/worker.md#stop).

A process manager stops a Celery worker with a signal to its main process (``kill -TERM PID``) or to its whole
process group (``kill -TERM -- -PGID``: systemd's default ``KillMode=control-group``, supervisord's
``stopasgroup``, Kubernetes and Docker through the container's init). Celery turns SIGTERM and SIGINT in the main
process into a shutdown and sends ``worker_shutting_down`` there; this module records that signal in a page of
memory shared with the prefork pool's children (mapped at import, in the main process, before the pool forks them),
so the child running a Job sees it too. A prefork child also receives the group's SIGTERM itself, whose default
action would kill it and, through the kernel's parent-death signal, the code: while a Job runs, ``job_guard``
catches it instead. Either way ``stop_signal()`` names the signal and ``worker.execute`` stops the code the way an
abort does (``MADO_JOB_STOP_SIGNAL``, SIGKILL after ``MADO_JOB_KILL_GRACE`` s), then ends the Job ``preempted``.

Imported by ``config.celery`` when the worker starts (``worker_init``), in the main process before the pool forks;
no Django import here, since that may come before Django is set up.
"""

import mmap
import os
import signal
import struct
from collections.abc import Iterator
from contextlib import contextmanager

from celery.signals import worker_shutting_down

_FORMAT = "i"
# Anonymous and MAP_SHARED: a write by the main process is seen by every pool child forked after this import.
_SHARED = mmap.mmap(-1, struct.calcsize(_FORMAT))
_state = {"main_pid": os.getpid(), "own_signal": 0}


def request_stop(signum: int) -> None:
    """Record that this worker is stopping because of signal ``signum`` (the first signal recorded stays).

    Called from a signal handler (no lock, no I/O): one aligned 4-byte write to the shared page. Every process of
    this worker (the main process and its pool children) sees it from then on through ``stop_signal()``.
    """
    if not struct.unpack_from(_FORMAT, _SHARED)[0]:
        struct.pack_into(_FORMAT, _SHARED, 0, int(signum))


def stop_signal() -> signal.Signals | None:
    """The signal that stopped this worker (or, in a pool child, the SIGTERM it received while running a Job), or
    None while the worker runs on (docs/design/worker.md#stop). Cheap enough to ask every poll of the code."""
    signum = _state["own_signal"] or struct.unpack_from(_FORMAT, _SHARED)[0]
    if not signum:
        return None
    try:
        return signal.Signals(signum)
    except ValueError:  # pragma: no cover - only our own writes reach the page
        return signal.SIGTERM


def stopped_reason(
    worker_signal: signal.Signals, result=None, *, stop_signal: int = signal.SIGTERM, grace_s: float = 0
) -> str:
    """The error of a Job that the worker's stop ended (docs/design/worker.md#stop), for its page and the API.

    ``worker_signal``: what stopped the worker; ``result``: the code's ``worker.runner.RunOutcome`` (None: the
    code never started); ``stop_signal``: what the code was sent; ``grace_s``: seconds it had before SIGKILL. E.g.
    "The worker was stopped (SIGTERM to the worker): the code was sent SIGTERM and exited with code 143 after 4.2 s."
    """
    head = f"The worker was stopped ({worker_signal.name} to the worker)"
    if result is None:
        return f"{head} before the code started."
    sent = f"{head}: the code was sent {signal.Signals(stop_signal).name}"
    if result.killed:
        return f"{sent}, was still running {grace_s:g} s later and was killed (SIGKILL)."
    after = f"after {result.stop_to_exit_s:.1f} s"
    if result.exit_code is not None and result.exit_code < 0:
        try:
            name = signal.Signals(-result.exit_code).name
        except ValueError:
            name = f"signal {-result.exit_code}"
        return f"{sent} and was ended by {name} {after}."
    return f"{sent} and exited with code {result.exit_code} {after}."


def cold_stop_reason(worker_signal: signal.Signals) -> str:
    """The error of a Job that a cold shutdown (a second SIGINT or SIGTERM, or SIGQUIT) broke into: the worker gave
    the code no grace (docs/design/worker.md#stop)."""
    return (
        f"The worker was stopped at once ({worker_signal.name} to the worker, then a cold shutdown): the code was "
        "killed without its grace and could not save; the Job resumes from its last complete checkpoint."
    )


@contextmanager
def job_guard() -> Iterator[None]:
    """While the block (one Job) runs in a prefork pool child, that child's SIGTERM asks the Job to stop
    (``stop_signal()``) instead of killing the child and, with it, the code (docs/design/worker.md#stop).

    In the process that imported this module (the solo pool's only process, tests) it does nothing: Celery's own
    SIGTERM handler there sends ``worker_shutting_down``. Enter it on the main thread, where a Celery task runs in
    both pools. When the block ends the child's previous handler (the default, set by Celery) is back and its own
    signal forgotten: a child that alone was sent SIGTERM (a revoke with ``terminate``) runs the next Job.
    """
    if os.getpid() == _state["main_pid"]:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_child_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _state["own_signal"] = 0


def _on_child_sigterm(signum, frame) -> None:
    _state["own_signal"] = _state["own_signal"] or signum


@worker_shutting_down.connect
def _on_shutting_down(sig: str = "SIGTERM", **kwargs) -> None:
    """Celery's warm or cold shutdown began in the main process (``sig``: ``"SIGTERM"``, ``"SIGINT"``, ``"SIGQUIT"``,
    or the name without ``SIG``)."""
    name = str(sig).upper()
    request_stop(getattr(signal, name if name.startswith("SIG") else f"SIG{name}", signal.SIGTERM))
