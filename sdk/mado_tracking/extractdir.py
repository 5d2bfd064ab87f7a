"""The temporary directory extraction writes into, renamed into place only when everything verified
(docs/design/worker.md#extract).

Shared by the worker (checkpoints, Code archives) and ``mado agent``'s
restore: each file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW``, relative
to its directory's descriptor, inside a fresh temporary directory, so nothing
is written outside it or through a link; on any failure the directory is
removed, so no partial directory is left behind (docs/design/house.md#verify-first).
``ExtractionDir`` is also a ``tarformat.TarReader`` sink.
"""

import errno
import hashlib
import os
import posixpath
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from mado_tracking.tarformat import Member

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
Fail = Callable[[str, str], BaseException]


def refuse_existing(target: Path) -> None:
    if os.path.lexists(target):
        raise FileExistsError(f"{target} already exists; a Job's working directory must be fresh")


class ExtractionDir:
    """A fresh temporary directory inside ``parent`` that only this object writes into; removed unless committed.

    Every directory is opened relative to its parent (``dir_fd``, ``O_NOFOLLOW``),
    so no link is ever followed and a long path never meets the system's
    path length limit. Also a ``TarReader`` sink: ``begin(member)`` creates
    the directory or the file (mode ``mode_of(member)``), ``data(view)``
    appends, ``end()`` closes. ``bytes_written`` counts the file bytes written.
    """

    def __init__(self, parent: Path, prefix: str, fail: Fail, *, mode_of: Callable[[Member], int] = lambda m: 0o444):
        self.root = tempfile.mkdtemp(prefix=prefix, dir=parent)
        self._root_fd = os.open(self.root, _DIRECTORY)
        self._fail = fail
        self._mode_of = mode_of
        self._committed = False
        self._cached: tuple[str, int] | None = None  # the last directory opened (files come sorted)
        self._out = None
        self._mode = 0
        self.bytes_written = 0

    def __enter__(self) -> "ExtractionDir":
        return self

    def __exit__(self, *exc_info) -> None:
        if self._out is not None:
            self._out.close()
        self._forget_cached()
        os.close(self._root_fd)
        if not self._committed:
            remove_tree(Path(self.root))

    def _forget_cached(self) -> None:
        if self._cached is not None:
            os.close(self._cached[1])
            self._cached = None

    def _open_dir(self, rel_dir: str, rel: str) -> int:
        """A descriptor of directory ``rel_dir`` (``/``-separated, created as needed) below the root; not to close."""
        if self._cached is not None and self._cached[0] == rel_dir:
            return self._cached[1]
        self._forget_cached()
        fd = os.dup(self._root_fd)
        try:
            for part in rel_dir.split("/") if rel_dir else ():
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
                try:
                    child = os.open(part, _DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except OSError:  # a file or a link where a directory must be
                    raise self._fail("path", f"{rel!r} needs {part!r} as a directory, but it is a file") from None
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        self._cached = (rel_dir, fd)
        return fd

    def make_dirs(self, rel_dir: str, rel: str) -> None:
        """Create the directories of ``rel_dir`` (``/``-separated) below the root."""
        self._open_dir(rel_dir, rel)

    def _create(self, rel: str):
        parent = self._open_dir(posixpath.dirname(rel), rel)
        try:
            fd = os.open(posixpath.basename(rel), _CREATE, 0o600, dir_fd=parent)
        except FileExistsError:
            raise self._fail("path", f"{rel!r} appears twice in the archive") from None
        except OSError as exc:  # a link in the way (O_NOFOLLOW), a name the file system refuses
            raise self._fail("path", f"{rel!r} cannot be created: {exc.strerror or exc}") from None
        return os.fdopen(fd, "wb", buffering=0)

    def begin(self, member: Member) -> None:
        """Create the member's directory, or its file (opened for ``data``)."""
        if member.is_dir:
            self.make_dirs(member.path, member.path)
            return
        self._out = self._create(member.path)
        self._mode = self._mode_of(member)

    def data(self, view) -> None:
        """Append ``view`` (bytes or a memoryview) to the file being written."""
        self.bytes_written += len(view)
        while view:
            view = view[self._out.write(view) :]

    def end(self) -> None:
        """Close the file being written with its final mode."""
        if self._out is not None:
            os.fchmod(self._out.fileno(), self._mode)
            self._out.close()
            self._out = None

    def write_file(self, rel: str, chunks: Iterable[bytes], *, mode: int, expect=None) -> None:
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
                    view = view[out.write(view) :]
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
        """Set every directory's mode and rename the root to ``target`` (which must not exist)."""
        self._forget_cached()
        _chmod_dirs(self.root, dir_mode)
        refuse_existing(target)
        os.rename(self.root, target)
        self._committed = True


def _chmod_dirs(root: str | Path, mode: int) -> None:
    """``mode`` on ``root`` and every directory below it, through descriptors (never a link, any depth of path)."""
    _walk_directories(root, lambda fd: os.fchmod(fd, mode), remove=False)


def remove_tree(path: Path, *, onerror: Callable | None = None) -> None:
    """Remove ``path`` and everything below it, read-only directories included, at any depth; a missing path is
    fine. ``onerror(exc)`` (optional) is called with an ``OSError`` instead of raising it."""
    try:
        if not os.path.lexists(path):
            return
        if os.path.islink(path) or not os.path.isdir(path):
            os.unlink(path)
            return
        # 0o700 before listing: a read-only directory (a restored checkpoint's) must be writable to empty it.
        _walk_directories(path, lambda fd: os.fchmod(fd, 0o700), remove=True)
        os.rmdir(path)
    except OSError as exc:
        if onerror is None:
            raise
        onerror(exc)


def _walk_directories(root: str | Path, visit: Callable[[int], None], *, remove: bool) -> None:
    """Call ``visit(fd)`` on ``root`` and every directory below it, parents first; with ``remove`` also delete
    every entry below ``root`` (``root`` itself stays).

    Iterative and holding two descriptors at a time: a tree a thousand levels deep (user code may write one, an
    old checkpoint may hold one) neither recurses nor runs out of descriptors, and no path is ever longer than
    one name. Going up is through ``..``, checked against the directory we came down from.
    """
    fd = os.open(root, _DIRECTORY | os.O_NOFOLLOW)
    above: list[tuple[tuple[int, int], str, list[str]]] = []  # per level: parent's identity, our name, its to-do
    try:
        visit(fd)
        pending = _subdirectories(fd, remove=remove)
        while pending or above:
            if pending:
                name = pending.pop()
                child = os.open(name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                above.append((_identity(fd), name, pending))
                os.close(fd)
                fd = child
                visit(fd)
                pending = _subdirectories(fd, remove=remove)
                continue
            identity, name, pending = above.pop()
            parent = os.open("..", _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = parent
            if _identity(fd) != identity:
                raise OSError(errno.ESTALE, f"a directory under {root} moved while it was walked")
            if remove:
                os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)


def _subdirectories(fd: int, *, remove: bool) -> list[str]:
    """The names of the directories in directory ``fd``; with ``remove`` every other entry is unlinked."""
    found = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                found.append(entry.name)
            elif remove:
                os.unlink(entry.name, dir_fd=fd)
    return found


def _identity(fd: int) -> tuple[int, int]:
    stat = os.fstat(fd)
    return stat.st_dev, stat.st_ino
