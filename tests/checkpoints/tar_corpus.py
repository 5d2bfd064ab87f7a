"""Crafted checkpoint tars, each a few hundred bytes, with the verdict docs/checkpoint-format.md gives them.

Headers are built by hand (``header``) or by ``tarfile`` and then patched
(``patched``), so every field can hold what a hostile or merely different
writer puts there. ``CASES`` maps a name to ``Case(tar, files, accept)``:
``files`` is the manifest the uploader declares (path → bytes).
"""

import hashlib
import io
import tarfile
import unicodedata
from dataclasses import dataclass

BLOCK = 512
END = bytes(2 * BLOCK)
POSIX = b"ustar\x0000"
GNU = b"ustar  \x00"


@dataclass(frozen=True)
class Case:
    tar: bytes
    files: dict  # path (str, or bytes for a name that is not UTF-8) -> content
    accept: bool


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def octal(value: int, width: int) -> bytes:
    return f"{value:0{width - 1}o}".encode() + b"\x00"


def with_checksum(block: bytearray) -> bytes:
    block[148:156] = b" " * 8
    block[148:156] = f"{sum(block):06o}".encode() + b"\x00 "
    return bytes(block)


def header(
    name: bytes | str,
    size: int = 0,
    kind: bytes = b"0",
    *,
    magic: bytes = POSIX,
    prefix: bytes = b"",
    mode: bytes | None = None,
    size_field: bytes | None = None,
    mtime_field: bytes | None = None,
) -> bytes:
    """One 512-byte header with a correct checksum; any field may be given raw."""
    raw = name.encode() if isinstance(name, str) else name
    block = bytearray(BLOCK)
    block[0 : len(raw[:100])] = raw[:100]
    block[100:108] = mode if mode is not None else octal(0o444, 8)
    block[108:116] = octal(0, 8)
    block[116:124] = octal(0, 8)
    block[124:136] = size_field if size_field is not None else octal(size, 12)
    block[136:148] = mtime_field if mtime_field is not None else octal(0, 12)
    block[156:157] = kind
    block[257:265] = magic
    block[345 : 345 + len(prefix)] = prefix
    return with_checksum(block)


def data_blocks(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def file_member(name, data: bytes = b"", **fields) -> bytes:
    return header(name, len(data), **fields) + data_blocks(data)


def pax_member(records: bytes, name: str = "PaxHeader") -> bytes:
    return header(name, len(records), b"x") + data_blocks(records)


def pax_record(key: str, value: bytes | str) -> bytes:
    body = key.encode() + b"=" + (value.encode() if isinstance(value, str) else value) + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) + 1 != length:
        length = len(str(length)) + len(body) + 1
    return str(length).encode() + b" " + body


def long_name_member(name: bytes) -> bytes:
    return header("././@LongLink", len(name) + 1, b"L", magic=GNU) + data_blocks(name + b"\x00")


def member(path: str, data: bytes, encoding: str) -> bytes:
    """A file member named ``path`` the way ``encoding`` says (ustar name/prefix, a PAX path, a GNU long name)."""
    raw = path.encode()
    if len(raw) <= 100 and encoding == "ustar":
        return file_member(raw, data)
    cut = raw.find(b"/", len(raw) - 101)
    if encoding == "ustar" and 0 < cut <= 155:
        return header(raw[cut + 1 :], len(data), prefix=raw[:cut]) + data_blocks(data)
    if encoding == "gnu":
        return long_name_member(raw) + file_member("long", data)
    return pax_member(pax_record("path", raw)) + file_member("pax", data)


def tar_of(*members: bytes) -> bytes:
    return b"".join(members) + END


def with_tarfile(files: dict, fmt=tarfile.PAX_FORMAT, extra: tuple = ()) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o444, 0
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    return buffer.getvalue()


def special(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, "model.pt" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
    return info


def patched(data: bytes, offset: int, new: bytes) -> bytes:
    """``data`` with ``new`` written at ``offset`` and the checksum of that header block fixed."""
    out = bytearray(data)
    out[offset : offset + len(new)] = new
    start = offset - offset % BLOCK
    out[start : start + BLOCK] = with_checksum(bytearray(out[start : start + BLOCK]))
    return bytes(out)


M = b"weights" * 10
GOOD = {"model.pt": M, "optim/state.pt": b"adam"}
LONG = "/".join(["p" * 254] * 16) + "/" + "q" * 16  # 4096 bytes, the longest path
NFC, NFD = unicodedata.normalize("NFC", "café.pt"), unicodedata.normalize("NFD", "café.pt")


def _cases() -> dict[str, Case]:
    good = with_tarfile(GOOD)
    accept = {
        "pax tar from tarfile": Case(good, GOOD, True),
        "ustar tar from tarfile": Case(with_tarfile(GOOD, tarfile.USTAR_FORMAT), GOOD, True),
        "gnu tar from tarfile": Case(with_tarfile(GOOD, tarfile.GNU_FORMAT), GOOD, True),
        "gnu long name": Case(with_tarfile({"d/" + "n" * 150: M}, tarfile.GNU_FORMAT), {"d/" + "n" * 150: M}, True),
        "pax long unicode name": Case(with_tarfile({"é/" + "ü" * 120: M}), {"é/" + "ü" * 120: M}, True),
        "ustar prefix and name": Case(
            tar_of(file_member("b" * 90, M, prefix=b"a" * 120)), {"a" * 120 + "/" + "b" * 90: M}, True
        ),
        "directory members": Case(
            tar_of(header("d/", kind=b"5"), header("d/e/", kind=b"5"), file_member("d/e/f", M)), {"d/e/f": M}, True
        ),
        "empty file only": Case(tar_of(file_member("empty.bin")), {"empty.bin": b""}, True),
        "base-256 size": Case(
            tar_of(header("m.pt", size_field=b"\x80" + (len(M)).to_bytes(11, "big")) + data_blocks(M)),
            {"m.pt": M},
            True,
        ),
        "component of 255 bytes": Case(
            tar_of(pax_member(pax_record("path", "x" * 255)), file_member("ignored", M)), {"x" * 255: M}, True
        ),
        "pax path wins over gnu long name": Case(
            tar_of(pax_member(pax_record("path", "pax.pt")), long_name_member(b"gnu.pt"), file_member("hdr.pt", M)),
            {"pax.pt": M},
            True,
        ),
        "gnu long name wins over the header name": Case(
            tar_of(long_name_member(b"gnu.pt"), file_member("hdr.pt", M)), {"gnu.pt": M}, True
        ),
        "path of 4096 bytes": Case(tar_of(pax_member(pax_record("path", LONG)), file_member("x", M)), {LONG: M}, True),
        "names that only start like windows devices": Case(
            tar_of(file_member("console.pt", M), file_member("com10/nul_.pt", M), file_member("lpt.d/aux-x", M)),
            {"console.pt": M, "com10/nul_.pt": M, "lpt.d/aux-x": M},
            True,
        ),
        "unknown pax keys are ignored": Case(
            tar_of(pax_member(pax_record("comment", "hi") + pax_record("mtime", "1.5")), file_member("m.pt", M)),
            {"m.pt": M},
            True,
        ),
    }
    refuse = {
        # "Why 1" of the issue, one case (or two) per bullet.
        "file then the same path as a directory": Case(
            tar_of(file_member("model", M), file_member("model/a.bin", M)), {"model": M, "model/a.bin": M}, False
        ),
        "directory then the same path as a file": Case(
            tar_of(file_member("model/a.bin", M), file_member("model", M)), {"model": M, "model/a.bin": M}, False
        ),
        "component of 300 bytes": Case(
            tar_of(pax_member(pax_record("path", "x" * 300)), file_member("x", M)), {"x" * 300: M}, False
        ),
        "gnu magic with a filled prefix": Case(
            tar_of(file_member("m.pt", M, magic=GNU, prefix=b"evil")), {"m.pt": M}, False
        ),
        "pax size with an underscore": Case(
            tar_of(pax_member(pax_record("size", "1_0")), file_member("m.pt", M)), {"m.pt": M}, False
        ),
        "negative base-256 size": Case(tar_of(header("m.pt", size_field=b"\xff" * 12)), {"m.pt": b""}, False),
        "non-octal mode": Case(tar_of(file_member("m.pt", M, mode=b"0000999\x00")), {"m.pt": M}, False),
        "pax size in words": Case(
            tar_of(pax_member(pax_record("size", "ten")), file_member("m.pt", M)), {"m.pt": M}, False
        ),
        "name that is not utf-8": Case(tar_of(file_member(b"caf\xe9.pt", M)), {b"caf\xe9.pt": M}, False),
        "pax record of a million digits": Case(
            tar_of(
                header("PaxHeader", 10**6 + 20, b"x") + data_blocks(b"9" * 10**6 + b" path=x\n"), file_member("x", M)
            ),
            {"x": M},
            False,
        ),
        # Member types.
        "symbolic link": Case(with_tarfile(GOOD, extra=(special("link", tarfile.SYMTYPE),)), GOOD, False),
        "hard link": Case(with_tarfile(GOOD, extra=(special("hard", tarfile.LNKTYPE),)), GOOD, False),
        "character device": Case(with_tarfile(GOOD, extra=(special("dev", tarfile.CHRTYPE),)), GOOD, False),
        "block device": Case(with_tarfile(GOOD, extra=(special("blk", tarfile.BLKTYPE),)), GOOD, False),
        "fifo": Case(with_tarfile(GOOD, extra=(special("pipe", tarfile.FIFOTYPE),)), GOOD, False),
        "contiguous file": Case(tar_of(file_member("m.pt", M, kind=b"7")), {"m.pt": M}, False),
        "global pax header": Case(
            tar_of(header("g", len(b"9 a=bc\n"), b"g") + data_blocks(b"9 a=bc\n"), file_member("m.pt", M)),
            {"m.pt": M},
            False,
        ),
        "gnu sparse member": Case(tar_of(file_member("m.pt", M, kind=b"S", magic=GNU)), {"m.pt": M}, False),
        "pax sparse keys": Case(
            tar_of(pax_member(pax_record("GNU.sparse.major", "1")), file_member("m.pt", M)), {"m.pt": M}, False
        ),
        "gnu long link name": Case(
            tar_of(header("././@LongLink", 4, b"K", magic=GNU) + data_blocks(b"abc\x00"), file_member("m.pt", M)),
            {"m.pt": M},
            False,
        ),
        # Names.
        "absolute path": Case(tar_of(file_member("/etc/m.pt", M)), {"/etc/m.pt": M}, False),
        "dot-dot path": Case(tar_of(file_member("a/../../m.pt", M)), {"a/../../m.pt": M}, False),
        "dot component": Case(tar_of(file_member("./m.pt", M)), {"./m.pt": M}, False),
        "empty component": Case(tar_of(file_member("a//m.pt", M)), {"a//m.pt": M}, False),
        "backslash": Case(tar_of(file_member("a\\m.pt", M)), {"a\\m.pt": M}, False),
        "newline in a name": Case(tar_of(file_member("m\n.pt", M)), {"m\n.pt": M}, False),
        "DEL in a name": Case(tar_of(file_member("m\x7f.pt", M)), {"m\x7f.pt": M}, False),
        "duplicate path": Case(tar_of(file_member("m.pt", M), file_member("m.pt", M)), {"m.pt": M}, False),
        "case-folded collision": Case(
            tar_of(file_member("Model.pt", M), file_member("model.pt", M)), {"Model.pt": M, "model.pt": M}, False
        ),
        "nfc collision": Case(
            tar_of(
                pax_member(pax_record("path", NFC)),
                file_member("a", M),
                pax_member(pax_record("path", NFD)),
                file_member("b", M),
            ),
            {NFC: M, NFD: M},
            False,
        ),
        "directory case collision": Case(
            tar_of(file_member("A/x.pt", M), file_member("a/y.pt", M)), {"A/x.pt": M, "a/y.pt": M}, False
        ),
        # Names Windows cannot create (a checkpoint must restore on Windows agents too).
        "windows device name": Case(tar_of(file_member("CON", M)), {"CON": M}, False),
        "windows device name with an extension": Case(tar_of(file_member("opt/nul.txt", M)), {"opt/nul.txt": M}, False),
        "windows device directory": Case(tar_of(file_member("Com1/m.pt", M)), {"Com1/m.pt": M}, False),
        "windows device with superscript digit": Case(
            tar_of(pax_member(pax_record("path", "lpt\u00b2.bin")), file_member("x", M)), {"lpt\u00b2.bin": M}, False
        ),
        "windows device before spaces and a dot": Case(
            tar_of(file_member("aux .tar.gz", M)), {"aux .tar.gz": M}, False
        ),
        "name ending in a dot": Case(tar_of(file_member("model.", M)), {"model.": M}, False),
        "directory ending in a space": Case(tar_of(file_member("run /m.pt", M)), {"run /m.pt": M}, False),
        "path of 4097 bytes": Case(
            tar_of(pax_member(pax_record("path", LONG + "q")), file_member("x", M)), {LONG + "q": M}, False
        ),
        "empty pax path": Case(tar_of(pax_member(pax_record("path", "")), file_member("m.pt", M)), {"m.pt": M}, False),
        # Structure.
        "bad checksum": Case(good[:148] + b"0000000\x00" + good[156:], GOOD, False),
        "not ustar magic": Case(tar_of(file_member("m.pt", M, magic=b"\x00" * 8)), {"m.pt": M}, False),
        "truncated inside a member": Case(tar_of(file_member("m.pt", M))[: BLOCK + 20], {"m.pt": M}, False),
        "truncated inside a header": Case(tar_of(file_member("m.pt", M))[:300], {"m.pt": M}, False),
        "no end-of-archive blocks": Case(file_member("m.pt", M), {"m.pt": M}, False),
        "one end block only": Case(file_member("m.pt", M) + bytes(BLOCK), {"m.pt": M}, False),
        "garbage after the end": Case(tar_of(file_member("m.pt", M)) + b"\x01" * BLOCK, {"m.pt": M}, False),
        "non-zero padding": Case(header("m.pt", len(M)) + M + b"\x01" * (BLOCK - len(M)) + END, {"m.pt": M}, False),
        "member after an empty block": Case(
            file_member("a", M) + bytes(BLOCK) + file_member("b", M) + END, {"a": M, "b": M}, False
        ),
        "pax header describing no member": Case(
            tar_of(file_member("m.pt", M), pax_member(pax_record("path", "x"))), {"m.pt": M}, False
        ),
        "two pax headers for one member": Case(
            tar_of(pax_member(pax_record("path", "a")), pax_member(pax_record("path", "b")), file_member("m.pt", M)),
            {"b": M},
            False,
        ),
        "pax key twice": Case(
            tar_of(pax_member(pax_record("path", "a") + pax_record("path", "b")), file_member("m", M)), {"b": M}, False
        ),
        "pax record with a wrong length": Case(
            tar_of(pax_member(b"99 path=a\n"), file_member("m", M)), {"a": M}, False
        ),
        "pax record without a value": Case(tar_of(pax_member(b"9 pathxx\n"), file_member("m", M)), {"m": M}, False),
        "directory with data": Case(tar_of(header("d/", len(M), b"5") + data_blocks(M)), {}, False),
        "negative base-256 mtime": Case(tar_of(file_member("m.pt", M, mtime_field=b"\xff" * 12)), {"m.pt": M}, False),
        "size beyond the total cap": Case(
            tar_of(header("m.pt", size_field=b"\x80" + (2**41).to_bytes(11, "big"))), {"m.pt": b""}, False
        ),
        # The tar is fine, the declaration differs.
        "extra file": Case(good, {"model.pt": M}, False),
        "missing file": Case(good, {**GOOD, "rng.pt": b"r"}, False),
        "size differs": Case(good, {**GOOD, "model.pt": M + b"!"}, False),
        "sha256 differs": Case(good, {**GOOD, "model.pt": M.upper()}, False),
    }
    return {**accept, **refuse}


CASES = _cases()
