"""The file-system artifact storage: every save is on disk before it returns (SPEC F1, F33).

Django's ``FileSystemStorage`` leaves a saved file in the page cache, so a
checkpoint could be ``complete`` while its tar was still only in memory: a
power cut or a killed VM then loses or truncates it. ``DurableFileSystemStorage``
``fsync``s each file and its directory before the save returns, and keeps a
multi-gigabyte stream from filling the page cache on the way: every
``FLUSH_AFTER`` bytes it asks the kernel to start writing the window just
written (``posix_fadvise(DONTNEED)`` starts writeback of dirty pages without
waiting for it) and drops the window before that one, written back by then,
so a few windows of memory carry the whole stream (the rule of PostgreSQL's
``backend_flush_after`` and RocksDB's ``bytes_per_sync``).
"""

import os

from django.core.files.storage import FileSystemStorage

FLUSH_AFTER = 8 * 1024 * 1024  # bytes written between two writeback requests


class DurableFileSystemStorage(FileSystemStorage):
    """``FileSystemStorage`` whose ``save`` returns only once the bytes and the file's name are on disk.

    A streamed save (``content.chunks()``) is written under a fresh name with
    ``O_EXCL`` (a taken name gets ``get_available_name``, as Django does); a
    save that fails part-way removes its file. Content with a
    ``temporary_file_path`` is moved by Django, then synced.
    """

    def _save(self, name: str, content) -> str:
        if hasattr(content, "temporary_file_path") or not hasattr(os, "posix_fadvise"):
            name = super()._save(name, content)
            _fsync_path(self.path(name))
        else:
            name = self._write_new(name, content)
        _fsync_directory(os.path.dirname(self.path(name)))
        return name

    def _write_new(self, name: str, content) -> str:
        directory = os.path.dirname(self.path(name))
        os.makedirs(directory, exist_ok=True)
        while True:
            try:
                fd = os.open(self.path(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
                break
            except FileExistsError:
                name = self.get_available_name(name)
        full_path = self.path(name)
        try:
            with open(fd, "wb", buffering=0) as handle:
                _write_flushing(handle, content.chunks())
            if self.file_permissions_mode is not None:
                os.chmod(full_path, self.file_permissions_mode)
        except BaseException:
            os.unlink(full_path)
            raise
        return os.path.relpath(full_path, self.location).replace("\\", "/")


def _write_flushing(handle, chunks) -> None:
    """Write every chunk, asking for writeback every ``FLUSH_AFTER`` bytes, then ``fsync``."""
    fd = handle.fileno()
    written = requested = dropped = 0
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            view = view[handle.write(view):]
        written += len(chunk)
        if written - requested >= FLUSH_AFTER:
            os.posix_fadvise(fd, dropped, requested - dropped, os.POSIX_FADV_DONTNEED)  # written back by now
            os.posix_fadvise(fd, requested, written - requested, os.POSIX_FADV_DONTNEED)  # start its writeback
            dropped, requested = requested, written
    os.fsync(fd)


def _fsync_path(path: str) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
