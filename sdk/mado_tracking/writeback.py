"""Writing a big file without piling it up in the page cache (Linux ``sync_file_range``;
docs/design/checkpoints.md#a-checkpoint, #save-and-restore).

A checkpoint of many gigabytes written at memory speed leaves as many
gigabytes of dirty pages, which the kernel then writes back in one burst,
and every page of them is memory the process first had to get from the
kernel (on a virtual machine that lends its memory back and forth, that
first touch is the costly part). ``Writeback`` does what PostgreSQL's
``backend_flush_after`` does: every ``window`` bytes it starts the
writeback of the window just written (``sync_file_range(WRITE)``, no
wait), waits for the window before it (usually written by then) and drops
that one from the cache (``posix_fadvise(DONTNEED)``), so a few windows of
memory carry the whole file and a slow disk slows the writer instead.

Used by the server's file-system storage (``checkpoints.filesystem``) and by
``log_checkpoint(wait=False)``'s snapshot copies (``mado_tracking.staging``).
Where there is no ``sync_file_range`` (macOS, Windows) ``AVAILABLE`` is
False and ``Writeback.advance`` does nothing.
"""

import ctypes
import errno
import os

__all__ = ["AVAILABLE", "WINDOW_BYTES", "Writeback", "copy_windowed"]

WINDOW_BYTES = 8 * 1024 * 1024  # bytes written between two writeback requests
_WAIT_BEFORE, _WRITE, _WAIT_AFTER = 1, 2, 4  # <linux/fs.h> SYNC_FILE_RANGE_*
_UNSUPPORTED = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP}  # copy_file_range cannot copy these


def _sync_file_range():
    """libc's ``sync_file_range(fd, offset, nbytes, flags)`` (Linux), or None where there is none."""
    if not hasattr(os, "posix_fadvise"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range  # the process's C library: no ldconfig run
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return function


_SYNC_FILE_RANGE = _sync_file_range()
AVAILABLE = _SYNC_FILE_RANGE is not None


def _sync_range(fd: int, offset: int, length: int, flags: int) -> None:
    if _SYNC_FILE_RANGE(fd, offset, length, flags) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


class Writeback:
    """Keeps at most two ``WINDOW_BYTES`` windows of the file open as ``fd`` dirty or cached while it is written.

    Call ``advance(written)`` with the bytes written so far (from offset 0)
    after each write, and ``drop_rest()`` once the file is on disk (after
    ``fsync``) to drop the last windows too. Raises ``OSError`` from the
    kernel (``EIO`` from a failed writeback, say).
    """

    def __init__(self, fd: int):
        self._fd = fd
        self._requested = 0  # writeback started up to here
        self._dropped = 0  # written back and dropped from the cache up to here

    def advance(self, written: int) -> None:
        if not AVAILABLE or written - self._requested < WINDOW_BYTES:
            return
        _sync_range(self._fd, self._requested, written - self._requested, _WRITE)
        if self._requested > self._dropped:
            _sync_range(self._fd, self._dropped, self._requested - self._dropped, _WAIT_BEFORE | _WRITE | _WAIT_AFTER)
            os.posix_fadvise(self._fd, self._dropped, self._requested - self._dropped, os.POSIX_FADV_DONTNEED)
        self._dropped, self._requested = self._requested, written

    def drop_rest(self) -> None:
        if AVAILABLE:
            os.posix_fadvise(self._fd, self._dropped, 0, os.POSIX_FADV_DONTNEED)


def copy_windowed(source: str | os.PathLike, destination: str | os.PathLike) -> bool:
    """Copy ``source`` to ``destination`` (created or truncated) kernel-side (``copy_file_range``) under
    ``Writeback``; True if done.

    False where that cannot work: no ``sync_file_range`` or
    ``copy_file_range`` (``destination`` untouched), or the kernel refuses
    the first range (another file system on an old kernel, a file system
    without it; the file this opened removed); the caller then copies
    another way. ``OSError`` for anything else
    (``ENOSPC``…), the partial ``destination`` removed. ``destination`` is
    not ``fsync``ed: the last two windows may still be in the page cache.
    """
    if not AVAILABLE or not hasattr(os, "copy_file_range"):
        return False
    reader = os.open(source, os.O_RDONLY)
    try:
        writer = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        writeback, written = Writeback(writer), 0
        try:
            while count := os.copy_file_range(reader, writer, WINDOW_BYTES):
                written += count
                writeback.advance(written)
        except OSError as exc:
            os.unlink(destination)
            if written == 0 and exc.errno in _UNSUPPORTED:
                return False
            raise
        finally:
            os.close(writer)
    finally:
        os.close(reader)
    return True
