"""The one reader of checkpoint tars: strict, streaming, bounded (docs/design/checkpoints.md#a-checkpoint, #tar-format;
docs/design/worker.md#verify, #refusal; docs/checkpoint-format.md).

The server's upload check, the worker's restore and the SDK's restore all
parse tars here, so they cannot disagree. ``TarReader`` is fed the bytes in
chunks as they arrive and hands each member to a sink (``begin(member)``,
``data(view)`` for its bytes, ``end()``); it holds one 512-byte header and at
most one extended header (``Limits.pax_bytes``) at a time, plus the names it
has seen, once each (bounded by ``Limits.members`` and ``Limits.name_bytes``),
and never recurses over a path's depth. Anything the format does
not allow raises ``ManifestMismatch`` (``what`` is ``tar`` for the structure,
``path`` for a name) naming the member and the rule, as soon as it shows.
``CheckpointVerifier`` (``verify.py``) compares the members with a manifest.
"""

import os
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, fields

BLOCK = 512
_ZERO = bytes(BLOCK)
_POSIX_MAGIC = b"ustar\x0000"
_GNU_MAGIC = b"ustar  \x00"
_FILE = (b"0", b"\x00")
_DIR = b"5"
_KIND = {
    b"1": "hard link",
    b"2": "symbolic link",
    b"3": "character device",
    b"4": "block device",
    b"6": "FIFO",
    b"7": "contiguous file",
    b"g": "global PAX header",
    b"K": "GNU long link name",
    b"S": "GNU sparse file",
    b"D": "GNU dump directory",
    b"M": "GNU multi-volume member",
    b"V": "GNU volume header",
    b"5": "directory",
}
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Names Windows reserves for devices, in any case and with any extension (``nul.txt``); ¹²³ count as digits there.
_WINDOWS_DEVICE = re.compile(r"(?i)(con|prn|aux|nul|com[1-9¹²³]|lpt[1-9¹²³])")
_NUMERIC_FIELDS = (("mode", 100, 108), ("uid", 108, 116), ("gid", 116, 124), ("mtime", 136, 148))


class ManifestMismatch(Exception):
    """The tar breaks the format or differs from its manifest or declaration.

    ``what`` is ``tar`` (the structure), ``path`` (a name), ``manifest``
    (an extra or missing file), ``size`` or ``sha256``; ``detail`` says
    exactly what differed. Callers show ``Checkpoint <id> <what> mismatch:
    <detail>`` (docs/design/worker.md#refusal).
    """

    def __init__(self, what: str, detail: str):
        super().__init__(f"{what} mismatch: {detail}")
        self.what = what
        self.detail = detail


@dataclass(frozen=True)
class Limits:
    """What one tar may hold; the defaults are those of docs/checkpoint-format.md.

    ``members``: files and directories; ``path_bytes`` / ``component_bytes``:
    UTF-8 bytes of a whole path / of one name between slashes; ``depth``: names
    between slashes in one path; ``name_bytes``: UTF-8 bytes of every path of
    one tar or manifest together; ``pax_bytes``: one PAX extended header or GNU
    long name; ``total_bytes``: the sum of the members' sizes.
    """

    members: int = 100_000
    path_bytes: int = 4096
    component_bytes: int = 255
    depth: int = 64
    name_bytes: int = 32 << 20
    pax_bytes: int = 64 * 1024
    total_bytes: int = 1 << 40

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "Limits":
        """The limits with ``MADO_TAR_MAX_<FIELD>`` (e.g. ``MADO_TAR_MAX_MEMBERS``) overriding each default.

        Raises ``ValueError`` naming the variable when it is not a positive integer.
        """
        values = {}
        for field in fields(cls):
            name = f"MADO_TAR_MAX_{field.name.upper()}"
            raw = environ.get(name, "").strip()
            if raw:
                if not raw.isdigit() or int(raw) < 1:
                    raise ValueError(f"{name} must be a positive integer, not {raw!r}")
                values[field.name] = int(raw)
        return cls(**values)


@dataclass(frozen=True)
class Member:
    """One member as the sink sees it: ``index`` (1-based), ``path`` (checked), ``is_dir``, ``size`` (bytes),
    ``mode``."""

    index: int
    path: str
    is_dir: bool
    size: int
    mode: int


def fold(path: str) -> str:
    """The key under which two names collide on a case-insensitive, normalising file system (NFC + case folding)."""
    if path.isascii():
        return path.lower()
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", path).casefold())


def check_path(path: str | bytes, limits: Limits = Limits(), *, label: str = "") -> str:
    """The path as text when it is a safe, normalised relative POSIX path; else ``ManifestMismatch('path', …)``.

    Rules: valid UTF-8, at most ``limits.path_bytes`` bytes,
    ``limits.component_bytes`` per component and ``limits.depth`` components, no control character, no
    backslash, not absolute, no empty, ``.`` or ``..`` component, and no
    component Windows cannot create (``windows_refusal``), since a checkpoint
    must restore on Windows agents too (docs/design/worker.md#verify).
    ``label`` prefixes the error (``member 3``).
    """
    where = f"{label} " if label else ""
    try:
        raw = path.encode("utf-8") if isinstance(path, str) else path
    except UnicodeEncodeError:  # a lone surrogate, e.g. from JSON "\ud800"
        raise ManifestMismatch("path", f"{where}{path!r}: the name is not valid UTF-8") from None
    if len(raw) > limits.path_bytes:
        raise ManifestMismatch(
            "path", f"{where}{raw[:60]!r}…: path of {len(raw)} bytes is longer than {limits.path_bytes} bytes"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestMismatch("path", f"{where}{raw!r}: the name is not valid UTF-8") from None
    if _CONTROL.search(text):
        raise ManifestMismatch("path", f"{where}{text!r}: the name holds a control character")
    if not text or text.startswith("/") or "\\" in text:
        raise ManifestMismatch("path", f"{where}{text!r}: the path is empty, absolute or holds a backslash")
    parts = text.split("/")
    if len(parts) > limits.depth:
        raise ManifestMismatch(
            "path", f"{where}{text[:60]!r}…: path of {len(parts)} levels is deeper than {limits.depth} levels"
        )
    for part in parts:
        if part in ("", ".", ".."):
            raise ManifestMismatch("path", f"{where}{text!r} is not a normalised relative path (no '..', '.', '//')")
        if len(part.encode("utf-8")) > limits.component_bytes:
            raise ManifestMismatch(
                "path",
                f"{where}{text!r}: a name of {len(part.encode('utf-8'))} bytes is longer "
                f"than {limits.component_bytes} bytes",
            )
        refusal = windows_refusal(part)
        if refusal:
            raise ManifestMismatch("path", f"{where}{text!r}: {refusal}")
    return text


def windows_refusal(name: str) -> str:
    """Why Windows cannot create a file or directory called ``name`` (one path component), or ``""``.

    Refused: a name ending in ``.`` or a space (Windows drops them, so
    ``a.`` and ``a`` would be one file) and a device name (``CON``, ``PRN``,
    ``AUX``, ``NUL``, ``COM1``–``COM9``, ``LPT1``–``LPT9``, also with
    superscript digits), in any case, alone or before an extension
    (``nul.txt``, ``Com1.tar.gz``) and with spaces before the dot.
    """
    if name.endswith((".", " ")):
        return f"the name {name!r} ends with a dot or a space, which Windows drops"
    if _WINDOWS_DEVICE.fullmatch(name.split(".", 1)[0].rstrip(" ")):
        return f"{name!r} is a device name on Windows (CON, PRN, AUX, NUL, COM1-9, LPT1-9), with or without extension"
    return ""


class Names:
    """The paths of one tar or manifest, refusing duplicates, NFC / case-fold collisions, a file that is also a
    directory, and more than ``limits.name_bytes`` bytes of names in all.

    Memory is linear in the bytes of the paths listed: each path is kept once
    (folded and as spelled), never once per directory above it. A file that
    collides with another file is refused as it is added; a clash that
    involves a directory above a path (``model`` a file and ``model/a.bin``,
    ``A/x`` and ``a/y``) shows in ``finish()``, which sorts the paths once so
    that every path sits next to those below it.
    """

    def __init__(self, limits: Limits = Limits()):
        self._limits = limits
        self._files: dict[str, str] = {}
        # (folded path with "/" as NUL, so a directory's contents sort right after it; as spelled; is_dir; label)
        self._seen: list[tuple[str, str, bool, str]] = []
        self.name_bytes = 0

    def add(self, path: str, *, is_dir: bool, label: str = "") -> None:
        """Record ``path`` (already checked by ``check_path``); ``ManifestMismatch('path', …)`` on a clash."""
        where = f"{label} " if label else ""
        self.name_bytes += len(path.encode("utf-8"))
        if self.name_bytes > self._limits.name_bytes:
            raise ManifestMismatch(
                "path", f"{where}{path[:60]!r}: the names hold more than {self._limits.name_bytes} bytes in all"
            )
        key = fold(path)
        if not is_dir:
            other = self._files.get(key)
            if other == path:
                raise ManifestMismatch("path", f"{where}{path!r} appears twice")
            if other is not None:
                raise ManifestMismatch(
                    "path", f"{where}{path!r} collides with {other!r} (same name once normalised or case-folded)"
                )
            self._files[key] = path
        self._seen.append((key.replace("/", "\x00"), path, is_dir, where))

    def finish(self) -> None:
        """Check the clashes through directories among every path added; ``ManifestMismatch('path', …)``."""
        seen, self._seen = sorted(self._seen), []
        for before, after in zip(seen, seen[1:]):
            _directory_clash(before, after)


def check_paths(paths, limits: Limits = Limits(), *, new: str | None = None) -> list[str]:
    """The checkpoint format's name, depth and collision rules, all of them, for the files of ONE checkpoint.

    Every path of ``paths`` (the checkpoint's files, regular files only) passes ``check_path``
    (UTF-8, control characters, absolute / ``..`` / ``//``, length, component length, depth,
    Windows device names and trailing dots or spaces), and the set passes ``Names`` (duplicates,
    NFC / case-fold collisions, a file that is also a directory, directories spelled two ways, the
    bytes of all the names). This is what every restore refuses (docs/checkpoint-format.md#names-one-precedence),
    so every way a checkpoint is created calls it, or ``TarReader`` which runs the same two, before
    the checkpoint can complete (docs/design/checkpoints.md#names).

    ``new``: one more path, added last, so that a collision names it (a file joining a checkpoint
    whose files were checked already). Returns the checked paths (``new`` last); raises
    ``ManifestMismatch('path', <the file and the rule>)``.
    """
    names, checked = Names(limits), []
    for path in [*paths, *([new] if new is not None else [])]:
        checked.append(check_path(path, limits))
        names.add(checked[-1], is_dir=False)
    names.finish()
    return checked


def _directory_clash(before: tuple[str, str, bool, str], after: tuple[str, str, bool, str]) -> None:
    """Refuse two neighbouring paths (in folded order) when one needs the other, a file, as a directory, or when
    a directory above both is spelled two ways."""
    (key, path, is_dir, _), (next_key, next_path, next_is_dir, where) = before, after
    if key == next_key and is_dir != next_is_dir:
        file, folder = (next_path, path) if is_dir else (path, next_path)
        raise ManifestMismatch("path", f"{where}{file!r} is a file and also a directory of {folder!r}")
    if not is_dir and next_key.startswith(key + "\x00"):
        raise ManifestMismatch("path", f"{where}{next_path!r} needs {path!r} as a directory, but it is a file")
    folded, next_folded = key.split("\x00"), next_key.split("\x00")
    spelled, next_spelled = path.split("/"), next_path.split("/")
    depth = min(len(folded) - (not is_dir), len(next_folded) - (not next_is_dir))
    for level in range(depth):
        if folded[level] != next_folded[level]:
            return
        if spelled[level] != next_spelled[level]:
            raise ManifestMismatch(
                "path",
                f"{where}{next_path!r}: directory {'/'.join(next_spelled[: level + 1])!r} collides with "
                f"{'/'.join(spelled[: level + 1])!r} (same name once normalised or case-folded)",
            )


def _number(field: bytes, name: str, where: str) -> int:
    """An octal field (digits, then NUL or spaces) or a base-256 one (first byte 0x80: positive only)."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    if field[0] & 0x80:
        raise ManifestMismatch("tar", f"{where}: header field {name} is a negative or malformed base-256 number")
    text = field.rstrip(b"\x00 ").lstrip(b" ")
    if not text:
        return 0
    if text.strip(b"01234567"):
        raise ManifestMismatch("tar", f"{where}: header field {name} is not an octal number: {field!r}")
    return int(text, 8)


def parse_pax(data: bytes, where: str) -> dict[bytes, bytes]:
    """The records of a PAX extended header (``<length> <key>=<value>\\n``), strictly; repeated keys refused."""
    records: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos, pos + 12)
        digits = data[pos:space] if space > pos else b""
        if not digits.isdigit():
            raise ManifestMismatch("tar", f"{where}: malformed PAX record length at byte {pos}")
        end = pos + int(digits)
        if end <= space + 1 or end > len(data) or data[end - 1] != 0x0A:
            raise ManifestMismatch("tar", f"{where}: PAX record at byte {pos} has a wrong length")
        key, sep, value = data[space + 1 : end - 1].partition(b"=")
        if not sep or not key:
            raise ManifestMismatch("tar", f"{where}: PAX record at byte {pos} has no key=value")
        if key in records:
            raise ManifestMismatch("tar", f"{where}: PAX key {key.decode('ascii', 'replace')!r} appears twice")
        if key.startswith(b"GNU.sparse"):
            raise ManifestMismatch("tar", f"{where}: is a GNU sparse file; only regular files and directories")
        records[key] = value
        pos = end
    size = records.get(b"size")
    if size is not None and not (size.isdigit() and len(size) <= 20):
        raise ManifestMismatch("tar", f"{where}: PAX size {size[:30]!r} is not a decimal number")
    if records.get(b"path") == b"":
        raise ManifestMismatch("path", f"{where}: PAX path is empty")
    return records


class TarReader:
    """A push parser: ``feed(chunk)`` the tar's bytes in order, ``finish()`` after the last; see the module docstring.

    ``sink`` gets ``begin(Member)``, ``data(memoryview)`` (the member's bytes,
    in order) and ``end()`` for every regular file and directory. With
    ``code_paths`` a leading ``./`` is dropped and the ``./`` entry itself
    skipped (source archives); checkpoints have neither.
    """

    def __init__(self, sink, *, limits: Limits = Limits(), code_paths: bool = False):
        self._sink = sink
        self._limits = limits
        self._code_paths = code_paths
        self.names = Names(limits)
        self.count = 0
        self.total = 0
        self.offset = 0
        self._block = bytearray()
        self._remaining = 0  # bytes of the current member's data (or extended header) still to come
        self._padding = 0
        self._extended: tuple[bytes, bytearray, str] | None = None  # kind, payload, where
        self._pax: dict[bytes, bytes] | None = None
        self._long_name: bytes | None = None
        self._zero_blocks = 0
        self._ended = False

    def feed(self, chunk) -> None:
        """Consume the next bytes; raises ``ManifestMismatch`` as soon as something is refused."""
        view = memoryview(chunk).cast("B")
        self.offset += len(view)
        while view:
            if self._remaining:
                take = min(self._remaining, len(view))
                if self._extended is not None:
                    self._extended[1].extend(view[:take])
                else:
                    self._sink.data(view[:take])
                self._remaining -= take
                view = view[take:]
                if not self._remaining:
                    self._close_data()
            elif self._padding:
                take = min(self._padding, len(view))
                if any(view[:take]):
                    raise ManifestMismatch("tar", f"non-zero padding after member {self.count}")
                self._padding -= take
                view = view[take:]
            elif self._ended:
                if any(view):
                    raise ManifestMismatch("tar", "non-zero bytes after the end of the archive")
                return
            else:
                take = BLOCK - len(self._block)
                self._block.extend(view[:take])
                view = view[take:]
                if len(self._block) == BLOCK:
                    header, self._block = bytes(self._block), bytearray()
                    self._on_header(header)

    def finish(self) -> None:
        """Check that the archive ended with its two zero blocks; else ``ManifestMismatch('tar', …)``."""
        if not self._ended:
            raise ManifestMismatch("tar", f"the archive is truncated after {self.offset} bytes")
        self.names.finish()

    def _close_data(self) -> None:
        if self._extended is None:
            self._sink.end()
            return
        kind, payload, where = self._extended
        self._extended = None
        if kind == b"x":
            self._pax = parse_pax(bytes(payload), where)
        else:
            self._long_name = bytes(payload).split(b"\x00", 1)[0]
            if not self._long_name:
                raise ManifestMismatch("path", f"{where}: GNU long name is empty")

    def _on_header(self, header: bytes) -> None:
        if header == _ZERO:
            if self._pax is not None or self._long_name is not None:
                raise ManifestMismatch("tar", f"an extended header after member {self.count} describes no member")
            self._zero_blocks += 1
            self._ended = self._zero_blocks == 2
            return
        where = f"member {self.count + 1}"
        if self._zero_blocks:
            raise ManifestMismatch("tar", f"{where} follows an empty block")
        try:
            checksum = _number(header[148:156], "chksum", where)
        except ManifestMismatch:
            checksum = -1
        if checksum != sum(header[:148]) + 256 + sum(header[156:]):
            raise ManifestMismatch("tar", f"{where}: bad header checksum (not a tar, or corrupted)")
        magic = header[257:265]
        if magic == _GNU_MAGIC:
            if any(header[345:500]):
                raise ManifestMismatch(
                    "tar",
                    f"{where}: GNU header with a filled prefix field (GNU extensions "
                    "other than long names are not part of the format)",
                )
            prefix = b""
        elif magic == _POSIX_MAGIC:
            prefix = header[345:500].split(b"\x00", 1)[0]
        else:
            raise ManifestMismatch("tar", f"{where}: not a ustar header (magic {magic!r})")
        kind = header[156:157]
        size = _number(header[124:136], "size", where)
        mode = _number(header[100:108], "mode", where)
        for name, start, stop in _NUMERIC_FIELDS[1:]:
            _number(header[start:stop], name, where)
        name = header[:100].split(b"\x00", 1)[0]
        raw = prefix + b"/" + name if prefix else name
        if kind in (b"x", b"L"):
            self._start_extended(kind, size, where, raw)
        elif kind in _FILE or kind == _DIR:
            self._start_member(kind == _DIR, size, mode, raw, where)
        else:
            shown = ((self._pax or {}).get(b"path") or self._long_name or raw).decode("utf-8", "backslashreplace")
            raise ManifestMismatch(
                "tar",
                f"{where} {shown!r} is a {_KIND.get(kind, f'member of type {kind!r}')}; "
                "only regular files and directories are allowed",
            )

    def _start_extended(self, kind: bytes, size: int, where: str, raw: bytes) -> None:
        label = "PAX header" if kind == b"x" else "GNU long name"
        if (self._pax if kind == b"x" else self._long_name) is not None:
            raise ManifestMismatch("tar", f"{where}: two {label}s for one member")
        if size > self._limits.pax_bytes:
            raise ManifestMismatch(
                "tar", f"{where}: {label} of {size} bytes is larger than {self._limits.pax_bytes} bytes"
            )
        self._extended = (kind, bytearray(), f"{where} ({label})")
        self._remaining, self._padding = size, -size % BLOCK
        if not size:
            self._close_data()

    def _start_member(self, is_dir: bool, size: int, mode: int, raw: bytes, where: str) -> None:
        pax, long_name = self._pax or {}, self._long_name
        self._pax = self._long_name = None
        if b"size" in pax:
            size = int(pax[b"size"])
        raw = pax.get(b"path") or long_name or raw  # precedence: PAX path, GNU long name, ustar prefix/name
        if is_dir:
            if size:
                raise ManifestMismatch("tar", f"{where} {raw!r}: a directory with {size} bytes of data")
            raw = raw[:-1] if raw.endswith(b"/") else raw
        if self._code_paths:
            while raw.startswith(b"./"):
                raw = raw[2:]
            if raw in (b"", b"."):
                self._padding = -size % BLOCK
                return
        self.count += 1
        if self.count > self._limits.members:
            raise ManifestMismatch("tar", f"more than {self._limits.members} members")
        self.total += size
        if self.total > self._limits.total_bytes:
            raise ManifestMismatch("tar", f"{where}: the members hold more than {self._limits.total_bytes} bytes")
        path = check_path(raw, self._limits, label=where)
        self.names.add(path, is_dir=is_dir, label=where)
        self._sink.begin(Member(self.count, path, is_dir, size, mode))
        self._remaining, self._padding = size, -size % BLOCK
        if not size:
            self._sink.end()
