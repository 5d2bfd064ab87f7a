"""Run a Job's code as a subprocess (docs/design/worker.md#subprocess; docs/design/house.md#tasks).

An argv list (never a shell) in its own process group and session, with an
environment built from an allowlist: nothing of the worker's own
environment (server secret, database URL, storage keys) reaches the code
except ``PATH``, ``HOME``, ``LANG``, ``LC_ALL``, ``TMPDIR`` and what the
caller passes (``MMT_*``, ``CUDA_VISIBLE_DEVICES``). stdout and stderr are
merged and handed to ``on_output`` line by line in chunks, capped at
``log_max_bytes``. ``should_stop()`` (the Job's heartbeat, the worker's own
stop) is asked about once a second; when it says yes the whole process group
gets the stop signal (SIGTERM unless told otherwise) once, then SIGKILL after
``grace_s`` seconds.
"""

import codecs
import ctypes
import ctypes.util
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

ALLOWED_FROM_WORKER = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
TRUNCATED_LINE = "[log truncated]\n"
READ_SIZE = 64 * 1024
CHUNK_BYTES = 64 * 1024  # hand the log over at least this often (bytes) ...
FLUSH_S = 0.5  # ... or this often (seconds)
DRAIN_S = 5.0  # after the code exited: how long to wait for the pipe to close (a process that left the group)
TICK_S = 0.2

logger = logging.getLogger(__name__)


_PR_SET_PDEATHSIG = 1


def _parent_death_signal():
    """A ``preexec_fn`` that makes the kernel SIGKILL the code when the worker dies (Linux), or None.

    Without it, code in its own session outlives a worker killed by SIGKILL
    or the OOM killer, holding its GPUs while the reaper fails its Job. The
    libc function is resolved here, before the fork, so the child only makes
    one system call between fork and exec.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int

    def set_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return set_death_signal


class RunOutcome(NamedTuple):
    """``exit_code``: the code's exit status (negative: killed by that signal); ``stopped``: it was asked to stop;
    ``stop_to_exit_s``: seconds from the stop signal to the code's exit (None when not stopped); ``killed``: it was
    still running ``grace_s`` after the stop signal and got SIGKILL."""

    exit_code: int | None
    stopped: bool
    stop_to_exit_s: float | None = None
    killed: bool = False


def child_env(
    extra: Mapping[str, str], *, base: Mapping[str, str] | None = None, passthrough: Iterable[str] = ()
) -> dict[str, str]:
    """The environment of the code: the allowlisted variables of ``base`` (default ``os.environ``) plus ``extra``.

    ``extra`` may only hold ``MMT_*`` names and ``CUDA_VISIBLE_DEVICES``
    (else ``ValueError``); ``passthrough`` names more variables to copy
    from ``base`` (the container runner's ``DOCKER_HOST``).
    ``PYTHONUNBUFFERED=1`` so the log streams while the code runs.
    """
    base = os.environ if base is None else base
    env = {name: base[name] for name in (*ALLOWED_FROM_WORKER, *passthrough) if name in base}
    env.setdefault("PATH", os.defpath)
    env["PYTHONUNBUFFERED"] = "1"
    for name, value in extra.items():
        if not (name.startswith("MMT_") or name == "CUDA_VISIBLE_DEVICES"):
            raise ValueError(f"{name} may not be passed to a Job's code (only MMT_* and CUDA_VISIBLE_DEVICES)")
        env[name] = str(value)
    return env


class _LogSink:
    """Hands the merged output to ``on_output`` as text, whole lines at a time, until ``max_bytes`` were passed."""

    def __init__(self, on_output: Callable[[str], None], max_bytes: int):
        self._on_output = on_output
        self._max = max_bytes
        self._pending = bytearray()
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._last_flush = time.monotonic()
        self.passed = 0
        self.dropped = 0
        self.truncated = False

    def feed(self, data: bytes) -> None:
        if self.truncated:
            self.dropped += len(data)
            return
        self._pending += data
        if len(self._pending) >= CHUNK_BYTES:
            self.flush()

    def tick(self) -> None:
        if self._pending and time.monotonic() - self._last_flush >= FLUSH_S:
            self.flush()

    def flush(self, final: bool = False) -> None:
        self._last_flush = time.monotonic()
        cut = len(self._pending) if final or len(self._pending) >= CHUNK_BYTES else self._pending.rfind(b"\n") + 1
        if cut <= 0:
            return
        data = bytes(self._pending[:cut])
        del self._pending[:cut]
        room = self._max - self.passed
        if len(data) > room:
            self.truncated = True
            self.dropped += len(data) - room + len(self._pending)
            data = data[:room]
            self._pending.clear()
        self.passed += len(data)
        text = self._decoder.decode(data, final=final or self.truncated)
        if self.truncated:
            text = (text if not text or text.endswith("\n") else text + "\n") + TRUNCATED_LINE
        if text:
            self._on_output(text)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_process(
    argv: list[str],
    *,
    cwd,
    env: Mapping[str, str],
    on_output: Callable[[str], None],
    should_stop: Callable[[], bool] = lambda: False,
    grace_s: float = 30.0,
    poll_s: float = 1.0,
    log_max_bytes: int = 10 * 1024 * 1024,
    on_kill: Callable[[], None] | None = None,
    stop_signal: int = signal.SIGTERM,
) -> RunOutcome:
    """Run ``argv`` in ``cwd`` with exactly ``env``; stream its output; return ``RunOutcome``
    (docs/design/worker.md#subprocess).

    ``argv``: list of strings (``argv[0]`` is looked up on ``env["PATH"]``).
    ``on_output(text)`` gets stdout+stderr, merged, in whole lines when it
    can (at most ``log_max_bytes`` bytes, then one ``[log truncated]`` line).
    ``should_stop()`` is called every ``poll_s`` seconds while the code runs
    (also during the grace period); the first True → ``stop_signal`` (default
    SIGTERM; a Job's is ``MADO_JOB_STOP_SIGNAL``) to the process group, once,
    and SIGKILL ``grace_s`` seconds later (``on_kill()`` is then called, e.g.
    to kill a container). ``RunOutcome`` says how long the code took to exit
    after the stop signal and whether it had to be killed. When the code
    exits on its own, whatever it left running in its group is killed; if
    the worker itself dies, the kernel SIGKILLs the code (Linux). Raises ``OSError`` (e.g. ``FileNotFoundError``) when
    ``argv[0]`` cannot be started; the callbacks' exceptions propagate after the group is killed.
    """
    if not isinstance(argv, (list, tuple)) or not argv or not all(isinstance(part, str) for part in argv):
        raise ValueError("argv must be a non-empty list of strings")
    process = subprocess.Popen(  # noqa: S603 - an argv list, no shell
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
        preexec_fn=_parent_death_signal(),
    )
    pgid = process.pid  # start_new_session: the child leads its own session and process group
    sink = _LogSink(on_output, log_max_bytes)
    stop = _Stop(pgid, stop_signal, grace_s)
    try:
        _supervise(process, pgid, sink, should_stop, stop, poll_s, on_kill)
    except BaseException:
        _signal_group(pgid, signal.SIGKILL)
        process.kill()
        process.wait()
        raise
    finally:
        process.stdout.close()
    return RunOutcome(
        exit_code=process.returncode,
        stopped=stop.sent_at is not None,
        stop_to_exit_s=None if stop.sent_at is None else round(stop.exited_at - stop.sent_at, 3),
        killed=stop.killed,
    )


class _Stop:
    """The stop of one process group: the signal sent once, SIGKILL ``grace_s`` later; when each happened."""

    def __init__(self, pgid: int, signum: int, grace_s: float):
        self.pgid, self.signum, self.grace_s = pgid, signum, grace_s
        self.sent_at: float | None = None  # time.monotonic() of the stop signal
        self.exited_at: float | None = None  # ... and of the code's exit, once seen
        self.killed = False  # SIGKILL because the code outlived the grace period

    def send(self, now: float) -> None:
        self.sent_at = now
        logger.info(
            "stopping process group %d: %s, SIGKILL in %.0f s",
            self.pgid,
            signal.Signals(self.signum).name,
            self.grace_s,
        )
        _signal_group(self.pgid, self.signum)

    @property
    def kill_at(self) -> float | None:
        return None if self.sent_at is None else self.sent_at + self.grace_s


def _supervise(process, pgid, sink: _LogSink, should_stop, stop: _Stop, poll_s: float, on_kill) -> None:
    """The loop: read output, ask ``should_stop``, signal the group; records the stop's times in ``stop``."""
    fd = process.stdout.fileno()
    os.set_blocking(fd, False)
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    killed, eof, exited = False, False, False
    drain_until = None
    next_poll = time.monotonic() + poll_s
    try:
        while not (eof and exited and killed):
            now = time.monotonic()
            if not exited and process.poll() is not None:
                exited, stop.exited_at = True, now
            if not exited and now >= next_poll:
                next_poll = now + poll_s
                # asked during the grace period too: the Job's heartbeat keeps beating while the code saves
                if should_stop() and stop.sent_at is None:
                    stop.send(now)
            kill_at = stop.kill_at
            if not killed and kill_at is not None and now >= kill_at:
                _signal_group(pgid, signal.SIGKILL)
                killed, drain_until = True, now + DRAIN_S
                if not exited:
                    stop.killed = True
                    if on_kill is not None:
                        on_kill()
            elif not killed and exited and (kill_at is None or not _group_alive(pgid)):
                _signal_group(pgid, signal.SIGKILL)  # leftovers of a finished program get no grace
                killed, drain_until = True, now + DRAIN_S
            if drain_until is not None and now >= drain_until and exited:
                break
            if eof:
                time.sleep(TICK_S)
            else:
                for _key, _events in selector.select(TICK_S):
                    data = _read(fd)
                    if data is None:
                        continue
                    if not data:
                        eof = True
                        selector.unregister(fd)
                    else:
                        sink.feed(data)
            sink.tick()
        if not eof:
            while data := _read(fd):
                sink.feed(data)
        sink.flush(final=True)
    finally:
        selector.close()
    process.wait()
    if stop.exited_at is None:
        stop.exited_at = time.monotonic()


def _read(fd: int) -> bytes | None:
    try:
        return os.read(fd, READ_SIZE)
    except BlockingIOError:
        return None
