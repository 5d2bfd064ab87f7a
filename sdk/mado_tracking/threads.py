"""Starting the SDK's background threads so that the program's signals stay with its main thread."""

import signal
import threading

from mado_tracking.metrics import PROGRAM_SIGNALS


def start_without_program_signals(thread: threading.Thread) -> None:
    """Start ``thread`` with ``PROGRAM_SIGNALS`` blocked from its first instruction (POSIX; plain start elsewhere).

    A new thread inherits the mask of the thread that starts it, so the mask
    is set around ``start`` and restored at once: a SIGTERM meant for the
    training program never lands in an SDK thread (where Python would not
    run the handler and a main thread waiting in ``signal.pause()`` would
    sleep on). A signal arriving in that instant stays pending and is
    delivered when the mask is restored.
    """
    if not hasattr(signal, "pthread_sigmask"):
        thread.start()
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, PROGRAM_SIGNALS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
