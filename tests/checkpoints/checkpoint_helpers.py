"""Building checkpoint tars (good and bad) and driving the three-call save through the API.

Tars are built with Python's ``tarfile`` so the server is tested against an
independent writer; ``test_checkpoint_api`` also sends one built by the SDK.
"""

import errno
import hashlib
import io
import tarfile

FILES = {"model.pt": b"weights" * 1000, "optim/state.pt": b"s" * 700, "empty.bin": b""}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tuple:
    return name, data, kind, linkname


def make_tar(files: dict[str, bytes] | None = None, *, extra: list[tuple] = (), fmt=tarfile.PAX_FORMAT) -> bytes:
    """A tar of ``files`` (path → bytes) followed by ``extra`` raw members ``(name, data, type, linkname)``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for name, data in (files if files is not None else FILES).items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o444
            tar.addfile(info, io.BytesIO(data))
        for name, data, kind, linkname in extra:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, linkname, len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return buffer.getvalue()


def manifest_of(files: dict[str, bytes] | None = None) -> list[dict]:
    files = files if files is not None else FILES
    return [{"path": path, "size": len(data), "sha256": sha(data)} for path, data in sorted(files.items())]


def declaration(tar: bytes, files: dict[str, bytes] | None = None) -> dict:
    return {"tar_size": len(tar), "tar_sha256": sha(tar), "manifest": manifest_of(files)}


def register(client, run, step: int, key: str | None = None, **fields):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return client.post(f"/api/v1/runs/{run.pk}/checkpoints/", {"step": step, **fields}, format="json", **headers)


def put_tar(client, checkpoint_id: int, data: bytes, **extra):
    return client.put(f"/api/v1/checkpoints/{checkpoint_id}/tar", data=data, content_type="application/x-tar", **extra)


def complete(client, checkpoint_id: int, body: dict):
    return client.post(f"/api/v1/checkpoints/{checkpoint_id}/complete/", body, format="json")


def save(client, run, step: int, files: dict[str, bytes] | None = None) -> dict:
    """Register, upload and complete a checkpoint at ``step``; return its JSON (asserts every answer)."""
    files = files if files is not None else {"model.pt": f"weights at {step}".encode()}
    tar = make_tar(files)
    created = register(client, run, step, key=f"key-{run.pk}-{step}")
    assert created.status_code == 201, created.content
    checkpoint_id = created.json()["id"]
    uploaded = put_tar(client, checkpoint_id, tar)
    assert uploaded.status_code == 200, uploaded.content
    done = complete(client, checkpoint_id, declaration(tar, files))
    assert done.status_code == 200, done.content
    return done.json()


class FillsUp:
    """A file that takes ``room`` bytes, then raises ENOSPC, as a full volume does."""

    def __init__(self, real, room: int):
        self.real, self.room = real, room

    def write(self, data) -> int:
        self.room -= len(data)
        if self.room < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real.write(data)

    def fileno(self) -> int:
        return self.real.fileno()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.real.close()
