"""glibc malloc settings for the processes that stream checkpoint bytes (SPEC F12).

A checkpoint upload through the web process moves the tar in 1 MiB chunks
through three threads (the request thread reads and stores a chunk, one
thread checks the tar and each file's SHA-256, one hashes the whole tar), and
each chunk is freed as soon as the last of them is done with it. With glibc's
defaults a thread's arena hands the freed top of its heap back to the kernel
as soon as it exceeds 128 KiB, so the next chunk faults freshly zeroed pages
back in. Measured on that path (gunicorn's body reader over a socket, the
verifier's threads): 280,000–356,000 page faults per GiB with the defaults,
19,000–25,000 with the settings below; and ``benchmarks/checkpoint_io.py``
saved at 36–41 % of one SHA-256 pass with the defaults, 40–45 % with them,
in one session on two cores.

``tune_allocator()`` keeps up to ``TRIM_THRESHOLD_BYTES`` of freed memory
per arena and serves blocks up to ``MMAP_THRESHOLD_BYTES`` from the arenas
(not a fresh ``mmap`` each), so the chunks reuse the same pages. The server
then holds at most that much more resident memory per arena, and only after
it has used it. An operator's own ``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_MMAP_THRESHOLD_`` or ``GLIBC_TUNABLES`` win: nothing is changed then.
"""

import ctypes
import ctypes.util
import logging
import os

logger = logging.getLogger(__name__)

TRIM_THRESHOLD_BYTES = 64 << 20
MMAP_THRESHOLD_BYTES = 4 << 20
_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_OPERATOR_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


def tune_allocator() -> bool:
    """Apply the settings above to this process's glibc malloc; True when applied.

    False, changing nothing, where the C library is not glibc (musl, macOS)
    or the environment already sets one of ``_OPERATOR_SETTINGS``. Never
    raises: a process that cannot be tuned runs as before, only slower.
    """
    if any(name in os.environ for name in _OPERATOR_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    applied = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    applied = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and applied
    if not applied:
        logger.warning("mallopt refused the checkpoint streaming settings; uploads run with glibc's defaults")
    return applied
