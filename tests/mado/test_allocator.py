"""The web process keeps a checkpoint upload's freed chunks instead of faulting fresh pages per chunk
(docs/design/worker.md#fetch)."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# An upload as the web process receives it, in a process that has already held large buffers (the files'
# random bytes here; a long-lived server's earlier requests): gunicorn's request body over a socket, read in 1 MiB
# chunks, checked by CheckpointVerifier on a second thread (which hashes the tar on a third) and written out.
UPLOAD = """
import os, queue, resource, socket, sys, tempfile, threading
if sys.argv[1] == "tuned":
    from mado.allocator import tune_allocator
    print("applied" if tune_allocator() else "unchanged")
if sys.argv[1] == "wsgi":
    import config.wsgi  # what gunicorn imports in each worker
from gunicorn.http.body import Body, LengthReader
from gunicorn.http.unreader import SocketUnreader
from mado_tracking.tarstream import CheckpointTar
from mado_tracking.tarverify import CheckpointVerifier

directory = tempfile.mkdtemp()
for n in range(2):
    with open(os.path.join(directory, f"shard-{n}.bin"), "wb") as handle:
        handle.write(os.urandom(32 << 20))
tar = CheckpointTar(directory)
client, server = socket.socketpair()

def send():
    for part in tar:
        client.sendall(part)
    client.close()

threading.Thread(target=send).start()
body = Body(LengthReader(SocketUnreader(server), len(tar)))
verifier, chunks = CheckpointVerifier(), queue.Queue(8)

def check():
    while (chunk := chunks.get()) is not None:
        verifier.feed(chunk)

checker = threading.Thread(target=check)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
checker.start()
with open(os.devnull, "wb") as out:
    while chunk := body.read(1 << 20):
        chunks.put(chunk)
        out.write(chunk)
chunks.put(None)
checker.join()
verifier.finish()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def upload_faults(mode: str, **env: str) -> tuple[list[str], int]:
    clean = {
        name: value
        for name, value in os.environ.items()
        if name not in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")
    }
    out = subprocess.run(
        [sys.executable, "-c", UPLOAD, mode],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        # One hashing thread: the figure measures the allocator, not how many arenas a loaded machine's
        # thread timing happens to warm up (each hashing thread allocates in an arena of its own).
        env={**clean, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'sdk'}", "MADO_HASH_THREADS": "1", **env},
    ).stdout.split()
    return out[:-1], int(out[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's; other C libraries are left alone")
def test_tuned_web_process_faults_far_fewer_pages_per_upload():
    _, untuned = upload_faults("plain")
    said, tuned = upload_faults("tuned")
    assert said == ["applied"]
    # Measured: 15,000-20,000 page faults for these 64 MiB with glibc's defaults, 2,000-4,000 tuned (a smaller gap
    # than a 1 GiB upload shows: the test's own set-up faults count too); on a loaded machine 10,000 and 4,000.
    assert tuned * 2 < untuned, (tuned, untuned)


def test_operator_malloc_settings_win():
    assert upload_faults("tuned", MALLOC_TRIM_THRESHOLD_="131072")[0] == ["unchanged"]
    assert upload_faults("tuned", GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")[0] == ["unchanged"]
    assert upload_faults("tuned", GLIBC_TUNABLES="glibc.pthread.rseq=0")[0] == ["applied"]  # not malloc's


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's; other C libraries are left alone")
def test_wsgi_application_tunes_the_web_process(tmp_path):
    _, untuned = upload_faults("plain")
    _, served = upload_faults(
        "wsgi", DJANGO_SETTINGS_MODULE="config.settings", MADO_SECRET_KEY="x" * 60, MADO_DATA_DIR=str(tmp_path)
    )
    assert served * 2 < untuned, (served, untuned)
