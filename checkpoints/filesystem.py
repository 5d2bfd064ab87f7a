"""The file-system artifact storage: every save is on disk before it returns
(docs/design/checkpoints.md#a-checkpoint, #save-and-restore).

Django's ``FileSystemStorage`` leaves a saved file in the page cache, so a
checkpoint could be ``complete`` while its tar was still only in memory: a
power cut or a killed VM then loses or truncates it. ``DurableFileSystemStorage``
``fsync``s each file, its directory and any directory it had to create
before the save returns. On Linux it also keeps a multi-gigabyte stream from
filling the page cache on the way (``mado_tracking.writeback``, as
PostgreSQL's ``backend_flush_after``): every 8 MiB it starts the writeback
of the window just written, waits for the window before it and drops that
one from the cache, so a few windows of memory carry the whole stream and a
slow disk slows the upload instead of piling up dirty pages.
"""

import os

from django.core.files.storage import FileSystemStorage
from django.utils._os import safe_makedirs

from mado_tracking.writeback import Writeback


class DurableFileSystemStorage(FileSystemStorage):
    """``FileSystemStorage`` whose ``save`` returns only once the bytes and the file's name are on disk.

    A streamed save of bytes chunks is written under a fresh name with
    ``O_EXCL`` (a taken name gets ``get_available_name``, as Django does); a
    save that fails part-way (``ENOSPC``, a client that broke off) removes
    its file and re-raises. Anything else (content with a
    ``temporary_file_path``, ``allow_overwrite``) is saved by Django, then
    synced.
    """

    def _save(self, name: str, content) -> str:
        directory = os.path.dirname(self.path(name))
        created = _missing_directories(directory)
        if hasattr(content, "temporary_file_path") or self._allow_overwrite:
            name = super()._save(name, content)
            _fsync(self.path(name), os.O_RDONLY)
        else:
            name = self._write_new(name, content, directory)
        for path in [directory, *(os.path.dirname(path) for path in created)]:
            _fsync(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        return name

    def _write_new(self, name: str, content, directory: str) -> str:
        if self.directory_permissions_mode is not None:
            safe_makedirs(directory, self.directory_permissions_mode, exist_ok=True)
        else:
            os.makedirs(directory, exist_ok=True)
        while True:
            try:
                fd = os.open(self.path(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
                break
            except FileExistsError:
                name = self.get_available_name(name)
        full_path = self.path(name)
        try:
            with open(fd, "wb", buffering=0) as handle:
                _write_flushing(handle, content.chunks())
            if self.file_permissions_mode is not None:
                os.chmod(full_path, self.file_permissions_mode)
            self._ensure_location_group_id(full_path)
        except BaseException:
            os.unlink(full_path)
            raise
        return os.path.relpath(full_path, self.location).replace("\\", "/")


def _write_flushing(handle, chunks) -> None:
    """Write every chunk (str as UTF-8), keeping at most two windows dirty or cached (Linux), then ``fsync``."""
    fd = handle.fileno()
    writeback, written = Writeback(fd), 0
    for chunk in chunks:
        view = memoryview(chunk.encode() if isinstance(chunk, str) else chunk).cast("B")
        written += view.nbytes
        while view:
            view = view[handle.write(view) :]
        writeback.advance(written)
    os.fsync(fd)
    writeback.drop_rest()  # the last windows, clean now


def _missing_directories(path: str) -> list[str]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def _fsync(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
