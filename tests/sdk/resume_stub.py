"""``StubApi`` plus what a same-run resume reads: the start answers ``resumed``, and the Run's checkpoints
(list, detail with manifest, tar) are served from real tars the SDK's own writer made.

``tar_gets`` counts the downloads of each checkpoint's tar; ``tamper(id)`` flips a byte of the tar it serves
(the server's stored bytes going bad, its manifest and SHA-256 unchanged).

``add_files_checkpoint`` adds one saved through MLflow (``layout: "files"``, no tar): its files are served by
``GET checkpoints/{id}/files/<path>`` with ``Range`` / ``If-Range`` as the server does; ``file_gets`` counts the
GETs of each ``(id, path)``; ``files[id][path]`` may be changed (tampered stored bytes) and ``cut[(id, path)]``
answers that many GETs with half the body, then a closed connection.
"""

import hashlib
import json
import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

from mado_tracking.tarstream import CheckpointTar
from tests.sdk.stub_api import StubApi

RUN_ID = 1


class ResumeStubApi(StubApi):
    def __init__(self, *, resumed: bool = True, last_step: int | None = 26, **kwargs):
        self.resumed = resumed
        self.last_step = last_step
        self.checkpoints: dict[int, dict] = {}
        self.tars: dict[int, bytes] = {}
        self.tar_gets: Counter = Counter()
        self.files: dict[int, dict[str, bytes]] = {}
        self.file_gets: Counter = Counter()
        self.cut: Counter = Counter()
        self.list_gets = 0
        self.ended = False  # metric posts and heartbeats answer 409 run_ended (the reaper marked the Run crashed)
        super().__init__(**kwargs)

    def add_checkpoint(self, checkpoint_id: int, step: int, state: str = "complete", directory: Path | None = None):
        """A checkpoint of the Run at ``step``; a complete one holds ``directory``'s files (default: one file)."""
        resource = {"id": checkpoint_id, "run_id": RUN_ID, "step": step, "state": state, "error": "", "manifest": []}
        if state == "complete":
            if directory is None:
                directory = Path(f"stub-checkpoint-{checkpoint_id}")
                (directory / "nested").mkdir(parents=True, exist_ok=True)
                (directory / "nested" / "model.bin").write_bytes(f"weights at step {step}".encode() * 100)
            tar = CheckpointTar(directory, tar_hash=True)
            self.tars[checkpoint_id] = b"".join(tar)
            resource.update(tar_size=len(self.tars[checkpoint_id]), tar_sha256=tar.sha256, manifest=tar.manifest)
        self.checkpoints[checkpoint_id] = resource

    def add_files_checkpoint(self, checkpoint_id: int, step: int, files: dict[str, bytes]) -> dict:
        """A complete checkpoint of the Run at ``step`` made of ``files`` (path → bytes), as MLflow saves them."""
        manifest = [
            {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for path, data in sorted(files.items())
        ]
        resource = {
            "id": checkpoint_id,
            "run_id": RUN_ID,
            "step": step,
            "state": "complete",
            "error": "",
            "layout": "files",
            "framework": "transformers",
            "tar_size": None,
            "tar_sha256": "",
            "file_count": len(files),
            "total_bytes": sum(map(len, files.values())),
            "manifest": manifest,
        }
        self.files[checkpoint_id] = dict(files)
        self.checkpoints[checkpoint_id] = resource
        return resource

    def tamper(self, checkpoint_id: int) -> None:
        data = bytearray(self.tars[checkpoint_id])
        data[600] ^= 0xFF  # inside the first file's bytes
        self.tars[checkpoint_id] = bytes(data)

    def _handler(self):
        stub = self
        base = super()._handler()

        class Handler(base):
            def _run(self, body: dict, status: str = "running") -> dict:
                run = super()._run(body, status)
                run.update(
                    resumed=stub.resumed,
                    fencing_token=2,
                    last_step=stub.last_step if stub.resumed else None,
                    step_floor=(stub.last_step + 1) if stub.resumed and stub.last_step is not None else 0,
                    heartbeat_interval=3600,
                )
                return run

            def do_POST(self):
                if stub.ended and self.path.startswith(f"/api/v1/runs/{RUN_ID}/"):
                    self._body()
                    ended = {"error": "run_ended", "detail": "run ended as crashed; resume it", "field": None}
                    return self._answer(409, ended)
                if self.path == f"/api/v1/runs/{RUN_ID}/heartbeat/":
                    self._body()
                    return self._answer(200, {"status": "running"})
                if self.path == "/api/v1/runs/":  # a resume of an id the stub already knows is no conflict
                    stub.runs.clear()
                super().do_POST()

            def do_GET(self):
                path, _, query = self.path.partition("?")
                if path == f"/api/v1/runs/{RUN_ID}/checkpoints/":
                    stub.list_gets += 1
                    listed = sorted(stub.checkpoints.values(), key=lambda c: -c["step"])
                    if "all=1" not in query:
                        listed = [c for c in listed if c["state"] == "complete"]
                    results = [{k: v for k, v in c.items() if k != "manifest"} for c in listed]
                    return self._answer(
                        200, {"count": len(results), "next": None, "previous": None, "results": results}
                    )
                parts = path.strip("/").split("/")  # api v1 checkpoints <id> [tar]
                if parts[:3] == ["api", "v1", "checkpoints"] and len(parts) >= 4 and parts[3].isdigit():
                    checkpoint = stub.checkpoints.get(int(parts[3]))
                    if checkpoint is None:
                        return self._answer(404, {"error": "not_found", "detail": "no such checkpoint", "field": None})
                    if len(parts) == 4:
                        return self._answer(200, checkpoint)
                    if parts[4] == "files":
                        return self._file(checkpoint, unquote("/".join(parts[5:])))
                    stub.tar_gets[checkpoint["id"]] += 1
                    return self._send(200, stub.tars[checkpoint["id"]], "application/x-tar")
                super().do_GET()

            def _file(self, checkpoint: dict, path: str):
                stored = stub.files.get(checkpoint["id"])
                if stored is None:
                    detail = f"checkpoint {checkpoint['id']} is stored as one tar"
                    return self._answer(409, {"error": "conflict", "detail": detail, "field": "checkpoint"})
                entry = next((e for e in checkpoint["manifest"] if e["path"] == path), None)
                if entry is None:
                    return self._answer(404, {"error": "not_found", "detail": f"no file {path!r}", "field": "path"})
                stub.file_gets[(checkpoint["id"], path)] += 1
                data = stored[path][: entry["size"]]  # the server sends the recorded size, whatever is stored
                first, status = 0, 200
                wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                if wanted and self.headers.get("If-Range", f'"{entry["sha256"]}"') == f'"{entry["sha256"]}"':
                    first, status = int(wanted.group(1)), 206
                    data = data[first : int(wanted.group(2)) + 1 if wanted.group(2) else None]
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", f'"{entry["sha256"]}"')
                self.end_headers()
                if stub.cut[(checkpoint["id"], path)] > 0:
                    stub.cut[(checkpoint["id"], path)] -= 1
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data)

        return Handler


def points_of(stub: ResumeStubApi) -> list[tuple[str, int]]:
    return [(point["key"], point["step"]) for point in stub.points]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))
