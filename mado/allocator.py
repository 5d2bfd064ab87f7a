"""glibc malloc settings for the processes that stream checkpoint bytes (docs/design/worker.md#fetch).

A checkpoint upload through the web process moves the tar in 1 MiB chunks
through three threads (the request thread reads and stores a chunk, one
thread checks the tar and each file's SHA-256, one hashes the whole tar), and
each chunk is freed as soon as the last of them is done with it. With glibc's
defaults a thread's arena hands the freed top of its heap back to the kernel
as soon as it exceeds 128 KiB, so the next chunk faults freshly zeroed pages
back in. On that path (gunicorn's body reader over a socket, the verifier's
threads) the settings below fault far fewer pages per GiB and saves run
faster (docs/deploy.md, "Web process memory allocator" and "Measured").

``tune_allocator()`` keeps up to ``TRIM_THRESHOLD_BYTES`` of freed memory
per arena and serves blocks up to ``MMAP_THRESHOLD_BYTES`` from the arenas
(not a fresh ``mmap`` each), so the chunks reuse the same pages. A process
then keeps up to that much freed memory resident per arena (glibc makes one
per thread that allocates, at most 8 per core), and only memory it has used.
An operator's own ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_`` or
a ``glibc.malloc.*`` entry of ``GLIBC_TUNABLES``, set in the process's
environment before it starts, win: nothing is changed then.
"""

import ctypes
import logging
import os

logger = logging.getLogger(__name__)

TRIM_THRESHOLD_BYTES = 64 << 20
MMAP_THRESHOLD_BYTES = 4 << 20
_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_OPERATOR_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def tune_allocator() -> bool:
    """Apply the settings above to this process's glibc malloc; True when applied.

    False, changing nothing, where the C library has no ``mallopt`` (musl,
    macOS) or the operator set malloc's thresholds (see above). Never
    raises: a process that cannot be tuned runs as before, only slower.
    """
    if any(name in os.environ for name in _OPERATOR_SETTINGS) or "glibc.malloc." in os.environ.get(
        "GLIBC_TUNABLES", ""
    ):
        logger.info("malloc settings come from the environment; the checkpoint streaming settings are not applied")
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the process runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    applied = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    applied = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and applied
    if not applied:
        logger.warning("mallopt refused the checkpoint streaming settings; uploads run with glibc's defaults")
    return applied
