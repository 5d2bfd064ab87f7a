"""``mado_tracking.extract.extract_checkpoint_stream``: a checkpoint tar's bytes are verified and written by us,
file by file, in one pass, and must match its manifest exactly; a refusal leaves nothing behind
(docs/design/worker.md#verify, #extract; what ``mado agent`` does for a resumed trial)."""

import hashlib
import io
import stat
import tarfile

import pytest

from mado_tracking.errors import CheckpointError
from mado_tracking.extract import extract_checkpoint_stream
from mado_tracking.tarstream import CheckpointTar


def entry(path: str, data: bytes) -> dict:
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def extract(data: bytes, target, manifest):
    chunks = [data[i : i + 1000] for i in range(0, len(data), 1000)]
    return extract_checkpoint_stream(
        chunks,
        target,
        checkpoint_id=4,
        manifest=manifest,
        tar_size=len(data),
        tar_sha256=hashlib.sha256(data).hexdigest(),
    )


def crafted(members: list[tarfile.TarInfo | tuple[str, bytes]]) -> bytes:
    """A tar with ``members``: ``(path, data)`` regular files or prepared ``TarInfo`` (links, directories)."""
    path = io.BytesIO()
    with tarfile.open(fileobj=path, mode="w") as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                tar.addfile(info, io.BytesIO(member[1]))
    return path.getvalue()


def test_it_extracts_a_checkpoint_read_only(tmp_path):
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "model.pt").write_bytes(b"model")
    (source / "sub" / "rng.pt").write_bytes(b"rng")
    tar = CheckpointTar(source)
    target = extract(b"".join(tar), tmp_path / "out", tar.manifest)
    assert (target / "model.pt").read_bytes() == b"model" and (target / "sub" / "rng.pt").read_bytes() == b"rng"
    assert stat.S_IMODE((target / "model.pt").stat().st_mode) == 0o444
    assert stat.S_IMODE((target / "sub").stat().st_mode) == 0o555
    (target / "sub").chmod(0o700)
    target.chmod(0o700)


def link(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, "model.pt"
    return info


@pytest.mark.parametrize(
    "members, manifest, message",
    [
        ([link("evil", tarfile.SYMTYPE)], [], "Checkpoint 4 tar mismatch: member 1 'evil' is a symbolic link"),
        ([("model.pt", b"m"), link("hard", tarfile.LNKTYPE)], [entry("model.pt", b"m")], "'hard' is a hard link"),
        (
            [("../escape", b"x")],
            [entry("../escape", b"x")],
            "Checkpoint 4 path mismatch: member 1 '../escape' is not a",
        ),
        ([("/etc/x", b"x")], [entry("/etc/x", b"x")], "'/etc/x': the path is empty, absolute"),
        ([("a//b", b"x")], [entry("a//b", b"x")], "'a//b' is not a normalised relative path"),
        (
            [("model.pt", b"m"), ("extra.pt", b"e")],
            [entry("model.pt", b"m")],
            "Checkpoint 4 manifest mismatch: extra file 'extra.pt'",
        ),
        ([("model.pt", b"m")], [entry("model.pt", b"m"), entry("rng.pt", b"r")], "missing from the tar: 'rng.pt'"),
        ([("model.pt", b"m"), ("model.pt", b"m")], [entry("model.pt", b"m")], "'model.pt' appears twice"),
        (
            [("model.pt", b"mm")],
            [entry("model.pt", b"m")],
            "Checkpoint 4 size mismatch: 'model.pt' is 2 bytes in the tar",
        ),
        ([("model.pt", b"x")], [entry("model.pt", b"m")], "Checkpoint 4 sha256 mismatch: 'model.pt' has SHA-256"),
    ],
)
def test_it_refuses_a_tar_that_is_unsafe_or_differs_from_the_manifest(tmp_path, members, manifest, message):
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(")):
        extract(crafted(members), tmp_path / "out", manifest)
    assert list(tmp_path.iterdir()) == [], "nothing stays behind, nothing escapes"


def test_it_refuses_bytes_that_are_not_a_tar(tmp_path):
    with pytest.raises(CheckpointError, match="Checkpoint 4 tar mismatch: member 1: bad header checksum"):
        extract(b"not a tar at all" * 64, tmp_path / "out", [])
    assert list(tmp_path.iterdir()) == []
