"""A small tar header reader for extraction (issue 4 part 4; SPEC F13): no ``tarfile`` on untrusted bytes.

Python 3.11.7's ``tarfile`` predates the 2024–2025 fixes (PAX header
backtracking, link and filter bypasses), so the worker reads headers itself,
the same way ``checkpoints.tarverify`` does: ustar / PAX / GNU headers,
``x`` PAX records (``path``, ``size``) and ``L`` GNU long names for the next
member. Only regular files (and, when allowed, directories) come out; every
other type (links, devices, FIFOs, global PAX headers, sparse files…) is
refused through ``fail(what, detail)``, which must raise.
"""

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass

BLOCK = 512
EXTENDED_MAX = 1 << 20  # bytes of one PAX header or GNU long name
_REGULAR = (b"0", b"\x00")
_DIRECTORY = b"5"
_KIND = {b"1": "hard link", b"2": "symbolic link", b"3": "character device", b"4": "block device",
         b"5": "directory", b"6": "FIFO", b"7": "contiguous file", b"g": "global PAX header",
         b"K": "GNU long link name", b"S": "GNU sparse file", b"D": "GNU dump directory",
         b"M": "GNU multi-volume member", b"V": "GNU volume header"}

Fail = Callable[[str, str], BaseException]


@dataclass(frozen=True)
class TarMember:
    """One member: ``path`` as stored, ``is_dir``, ``size`` (bytes), permission ``mode`` and ``offset`` of its data."""

    path: str
    is_dir: bool
    size: int
    mode: int
    offset: int


def read_members(
    fileobj: io.BufferedIOBase, fail: Fail, *, allow_dirs: bool = False, total_size: int | None = None
) -> Iterator[TarMember]:
    """Yield the members of the tar read from ``fileobj`` (positioned at its start), headers only.

    The data of each member is skipped: by seeking when ``total_size`` (the
    file's length in bytes) is given, else read and dropped (a compressed
    stream). Read it later at ``offset``. The archive must end with its
    end-of-archive block: a truncated one is refused with ``fail("tar", …)``.
    """
    pos = 0
    pending_path: str | None = None
    pending_size: int | None = None
    while True:
        header = _read_exact(fileobj, BLOCK, fail, pos)
        if header is None:
            raise fail("tar", f"the archive ends after {pos} bytes without its end-of-archive block")
        pos += BLOCK
        if header == b"\x00" * BLOCK:
            return
        kind, path, size, mode = _parse(header, fail)
        data_offset = pos
        padded = size + (-size % BLOCK)
        if kind in (b"x", b"L"):
            if size > EXTENDED_MAX:
                raise fail("tar", f"extended header of {path!r} is larger than {EXTENDED_MAX} bytes")
            payload = _read_exact(fileobj, padded, fail, pos)
            if payload is None:
                raise fail("tar", f"the archive is truncated inside the extended header of {path!r}")
            pos += padded
            if kind == b"x":
                records = _parse_pax(payload[:size], fail)
                pending_path = records.get("path", pending_path)
                if "size" in records:
                    pending_size = _pax_int(records["size"], fail)
            else:
                pending_path = payload[:size].split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")
            continue
        if kind not in _REGULAR and not (allow_dirs and kind == _DIRECTORY):
            raise fail("tar", f"member {pending_path or path!r} is a {_KIND.get(kind, 'non-regular member')}")
        path = pending_path if pending_path is not None else path
        size = pending_size if pending_size is not None else size
        pending_path, pending_size = None, None
        is_dir = kind == _DIRECTORY
        if is_dir:
            size = 0
        yield TarMember(path=path, is_dir=is_dir, size=size, mode=mode, offset=data_offset)
        padded = size + (-size % BLOCK)
        _skip(fileobj, padded, fail, pos, total_size)
        pos += padded


def _parse(header: bytes, fail: Fail) -> tuple[bytes, str, int, int]:
    stored = _octal(header[148:156], "chksum", fail)
    unsigned = sum(header[:148]) + 256 + sum(header[156:])
    if stored != unsigned:
        raise fail("tar", "bad header checksum (not a tar, or corrupted)")
    name = header[:100].split(b"\x00", 1)[0]
    prefix = header[345:500].split(b"\x00", 1)[0] if header[257:263] == b"ustar\x00" else b""
    path = (prefix + b"/" + name if prefix else name).decode("utf-8", "surrogateescape")
    size = _octal(header[124:136], "size", fail)
    mode = _octal(header[100:108], "mode", fail)
    return header[156:157], path, size, mode


def _octal(field: bytes, name: str, fail: Fail) -> int:
    if field[:1] and field[0] & 0x80:
        if field[0] & 0x40:
            raise fail("tar", f"header field {name} is negative")
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\x00", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise fail("tar", f"header field {name} is not a number: {text!r}") from None


def _parse_pax(data: bytes, fail: Fail) -> dict[str, str]:
    records, pos = {}, 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0 or space - pos > 20:
            raise fail("tar", "malformed PAX header")
        length = _pax_int(data[pos:space].decode("ascii", "replace"), fail)
        end = pos + length
        if length <= space - pos or end > len(data) or data[end - 1 : end] != b"\n":
            raise fail("tar", "malformed PAX header")
        key, sep, value = data[space + 1 : end - 1].partition(b"=")
        if not sep:
            raise fail("tar", "malformed PAX header")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos = end
    return records


def _pax_int(text: str, fail: Fail) -> int:
    if not text.isdigit() or len(text) > 20:
        raise fail("tar", f"malformed PAX number {text[:30]!r}")
    return int(text)


def _read_exact(fileobj, size: int, fail: Fail, pos: int) -> bytes | None:
    """``size`` bytes, or None at a clean end of file; a partial block is a truncated archive."""
    parts, wanted = [], size
    while wanted:
        data = fileobj.read(wanted)
        if not data:
            break
        parts.append(data)
        wanted -= len(data)
    data = b"".join(parts)
    if not data:
        return None
    if len(data) < size:
        raise fail("tar", f"the archive is truncated after {pos + len(data)} bytes")
    return data


def _skip(fileobj, size: int, fail: Fail, pos: int, total_size: int | None) -> None:
    if not size:
        return
    if total_size is not None:
        if pos + size > total_size:
            raise fail("tar", f"the archive is truncated after {total_size} bytes")
        fileobj.seek(pos + size)
        return
    while size:
        data = fileobj.read(min(size, 1 << 20))
        if not data:
            raise fail("tar", f"the archive is truncated inside a member at byte {pos}")
        size -= len(data)
        pos += len(data)
