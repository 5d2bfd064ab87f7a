"""A staging directory that extraction writes into, renamed into place only when everything verified (SPEC F14).

Shared by the worker (checkpoints, Code archives) and ``mado agent``'s
restore: each file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` inside
a fresh temporary directory whose real path every created path must stay
under; on any failure the directory is removed, so no partial directory is
left behind (ARCHITECTURE rule 3). ``Staging`` is also a
``tarformat.TarReader`` sink.
"""

import hashlib
import os
import posixpath
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from mado_tracking.tarformat import Member

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
Fail = Callable[[str, str], BaseException]


def refuse_existing(target: Path) -> None:
    if os.path.lexists(target):
        raise FileExistsError(f"{target} already exists; a Job's working directory must be fresh")


class Staging:
    """A fresh temporary directory inside ``parent`` that only this object writes into; removed unless committed.

    Also a ``TarReader`` sink: ``begin(member)`` creates the directory or
    the file (mode ``mode_of(member)``), ``data(view)`` appends, ``end()``
    closes. ``bytes_written`` counts the file bytes written.
    """

    def __init__(self, parent: Path, prefix: str, fail: Fail, *, mode_of: Callable[[Member], int] = lambda m: 0o444):
        self.root = tempfile.mkdtemp(prefix=prefix, dir=parent)
        self._real_root = os.path.realpath(self.root)
        self._fail = fail
        self._mode_of = mode_of
        self._dirs: list[str] = []
        self._committed = False
        self._out = None
        self._mode = 0
        self.bytes_written = 0

    def __enter__(self) -> "Staging":
        return self

    def __exit__(self, *exc_info) -> None:
        if self._out is not None:
            self._out.close()
        if not self._committed:
            remove_tree(Path(self.root))

    def _inside(self, full: str, rel: str) -> None:
        real = os.path.realpath(full)
        if not real.startswith(self._real_root + os.sep):
            raise self._fail("path", f"{rel!r} resolves outside the extraction directory")

    def make_dirs(self, rel_dir: str, rel: str) -> str:
        """Create the directories of ``rel_dir`` (``/``-separated) below the root; return the last one's path."""
        current = self.root
        for part in rel_dir.split("/") if rel_dir else ():
            current = os.path.join(current, part)
            try:
                os.mkdir(current, 0o700)
                self._dirs.append(current)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(current).st_mode):
                    raise self._fail("path", f"{rel!r} needs {part!r} as a directory, but it is a file") from None
            self._inside(current, rel)
        return current

    def _create(self, rel: str):
        parent = self.make_dirs(posixpath.dirname(rel), rel)
        full = os.path.join(parent, posixpath.basename(rel))
        self._inside(full, rel)
        try:
            fd = os.open(full, _CREATE, 0o600)
        except FileExistsError:
            raise self._fail("path", f"{rel!r} appears twice in the archive") from None
        except OSError as exc:  # e.g. a name the file system refuses
            raise self._fail("path", f"{rel!r} cannot be created: {exc.strerror or exc}") from None
        return os.fdopen(fd, "wb", buffering=0)

    def begin(self, member: Member) -> None:
        if member.is_dir:
            self.make_dirs(member.path, member.path)
            return
        self._out = self._create(member.path)
        self._mode = self._mode_of(member)

    def data(self, view) -> None:
        self.bytes_written += len(view)
        while view:
            view = view[self._out.write(view):]

    def end(self) -> None:
        if self._out is not None:
            os.fchmod(self._out.fileno(), self._mode)
            self._out.close()
            self._out = None

    def write_file(
        self, rel: str, chunks: Iterable[bytes], *, mode: int, expect=None
    ) -> None:
        """Create ``rel`` (never existing before, never through a link), write ``chunks``, check ``expect``.

        ``expect`` (a ``ManifestFile`` or None): its size and SHA-256 are compared with what was written.
        """
        digest, count = hashlib.sha256(), 0
        with self._create(rel) as out:
            for chunk in chunks:
                count += len(chunk)
                digest.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[out.write(view):]
            os.fchmod(out.fileno(), mode)
        self.bytes_written += count
        if expect is not None:
            if count != expect.size:
                raise self._fail("size", f"{rel!r} is {count} bytes, {expect.size} in the manifest")
            if digest.hexdigest() != expect.sha256:
                raise self._fail(
                    "sha256", f"{rel!r} has SHA-256 {digest.hexdigest()}, the manifest says {expect.sha256}"
                )

    def commit(self, target: Path, *, dir_mode: int) -> None:
        """Set the directories' mode (deepest first) and rename the root to ``target`` (which must not exist)."""
        for directory in reversed(self._dirs):
            os.chmod(directory, dir_mode)
        os.chmod(self.root, dir_mode)
        refuse_existing(target)
        os.rename(self.root, target)
        self._committed = True


def remove_tree(path: Path, *, onerror: Callable | None = None) -> None:
    """Remove ``path`` and everything below it, read-only directories included; a missing path is fine."""
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
        return
    for dirpath, _dirnames, _filenames in os.walk(path):
        os.chmod(dirpath, 0o700)  # os.walk never descends into links, so only real directories get here
    shutil.rmtree(path, onerror=onerror)
