"""SHA-256 on several cores: how many threads, and ordered lanes to run the hashes on
(docs/design/checkpoints.md#hash-threads).

hashlib releases the GIL while it hashes a buffer larger than 2 KiB, so
digests updated on different threads run on different cores. A checkpoint's
verification holds one digest per file and one of the whole tar: each digest
must see its bytes in order, so each runs on one *lane* (a thread of its own,
taking work in the order it was given), and different digests run on
different lanes. The whole tar's digest is one chain and can use one core at
most; the files' digests spread over the other lanes.

``hash_threads()`` says how many threads hash at once: ``MADO_HASH_THREADS``
when set, else the cores this process may run on (``sched_getaffinity``),
at most ``DEFAULT_MAX_THREADS``, so a save that runs beside training code on a
large node leaves the other cores to it.
"""

import os
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["DEFAULT_MAX_THREADS", "ENV_THREADS", "Done", "Lanes", "available_cores", "hash_threads"]

ENV_THREADS = "MADO_HASH_THREADS"
DEFAULT_MAX_THREADS = 4


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask where the system has one), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def hash_threads(environ: Mapping[str, str] = os.environ) -> int:
    """Threads that hash at once: ``MADO_HASH_THREADS`` (a whole number >= 1), else
    ``min(available_cores(), DEFAULT_MAX_THREADS)``.

    Raises ``ValueError`` naming the variable when it is set to anything else.
    """
    raw = environ.get(ENV_THREADS, "").strip()
    if not raw:
        return min(available_cores(), DEFAULT_MAX_THREADS)
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{ENV_THREADS} must be a whole number >= 1 (threads that hash at once), not {raw!r}")
    return int(raw)


class Done:
    """What ``Lanes.submit`` returns when there are no threads: the call already ran."""

    def __init__(self, value=None):
        self._value = value

    def result(self):
        return self._value

    def done(self) -> bool:
        return True


class Lanes:
    """``count`` threads, each running what it is given in order; ``count`` 0 runs every call at once, inline.

    ``submit(lane, fn, *args)`` queues ``fn(*args)`` on thread ``lane % count``
    and returns its future (with no threads: runs it now, raising what it
    raises). At most ``ahead`` calls wait in all (the caller
    blocks on the oldest beyond that), so the chunks they hold stay bounded.
    The first error of any call is raised by the ``submit`` or ``wait`` that
    meets it. ``close()`` stops the threads (waiting for what runs).
    """

    def __init__(self, count: int, *, ahead: int = 16, name: str = "mado-sha256"):
        self.count = count
        self._executors = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=name) for _ in range(count)]
        self._pending: deque[Future] = deque()
        self._ahead = ahead

    def submit(self, lane: int, fn: Callable, *args) -> "Future | Done":
        if not self._executors:
            return Done(fn(*args))
        future = self._executors[lane % self.count].submit(fn, *args)
        self._pending.append(future)
        while len(self._pending) > self._ahead:
            self._pending.popleft().result()
        while self._pending and self._pending[0].done():
            self._pending.popleft().result()
        return future

    def wait(self) -> None:
        """Wait for every queued call; raise the first error."""
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> None:
        self._pending.clear()
        for executor in self._executors:
            executor.shutdown(wait=True, cancel_futures=True)
