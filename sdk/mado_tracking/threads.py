"""The signal mask of the SDK's own threads: every thread it starts leaves the program's signals to the main
thread."""

import signal

# Signals a training program handles (a scheduler's SIGTERM, SIGUSR1 before preemption, Ctrl-C, alarms). The
# kernel gives a process-directed signal to any thread that does not block it, and Python runs the handler only
# in the main thread: a main thread waiting in a system call (signal.pause(), a blocking read) wakes only when
# the signal is delivered to it, so every thread the SDK starts blocks them.
PROGRAM_SIGNALS = frozenset(
    getattr(signal, name)
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")
    if hasattr(signal, name)
)


def leave_program_signals_to_main_thread() -> None:
    """Block ``PROGRAM_SIGNALS`` in the calling thread (first thing an SDK thread does; POSIX only)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, PROGRAM_SIGNALS)
