"""The web process keeps a checkpoint upload's freed chunks instead of faulting fresh pages per chunk
(docs/design/worker.md#fetch; docs/deploy.md, "Web process memory allocator").

Each test reads glibc's own bookkeeping (``mallinfo2``) in a fresh process: a 3 MiB block (the size of a
few upload chunks) is served from the heap and kept there when freed once the settings apply, and is a fresh
``mmap`` of its own with glibc's defaults. The page faults per GiB these settings save are a figure, printed by
``benchmarks/checkpoint_io.py``; a count taken beside a loaded suite swung too far to assert a ratio on.
"""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import ctypes, sys
if sys.argv[1] == "tuned":
    from mado.allocator import tune_allocator
    print("applied" if tune_allocator() else "unchanged")
if sys.argv[1] == "wsgi":
    import config.wsgi  # what gunicorn imports in each worker
    print("wsgi")

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
before = libc.mallinfo2()
block = libc.malloc(3 << 20)
held = libc.mallinfo2()
libc.free(block)
after = libc.mallinfo2()
mapped = held.hblks > before.hblks
kept = after.arena >= held.arena and after.hblkhd >= held.hblkhd  # nothing handed back to the kernel
print("mmap" if mapped else "heap", "kept" if kept else "returned")
"""

glibc = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="mallopt and mallinfo2 are glibc's; other C libraries are left alone"
)


def probe(mode: str, **env: str) -> list[str]:
    """What a fresh process in ``mode`` printed: whether it tuned, then where a 3 MiB block lived and stayed."""
    clean = {
        name: value
        for name, value in os.environ.items()
        if name not in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")
    }
    return subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env={**clean, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'sdk'}", **env},
    ).stdout.split()


@glibc
def test_untuned_process_maps_a_fresh_block_and_hands_it_back():
    assert probe("plain") == ["mmap", "returned"]


@glibc
def test_tuned_process_serves_the_block_from_its_heap_and_keeps_it_when_freed():
    assert probe("tuned") == ["applied", "heap", "kept"]


@glibc
def test_operator_malloc_settings_win():
    assert probe("tuned", MALLOC_TRIM_THRESHOLD_="131072")[0] == "unchanged"
    assert probe("tuned", GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")[0] == "unchanged"
    assert probe("tuned", GLIBC_TUNABLES="glibc.pthread.rseq=0")[0] == "applied"  # not malloc's


@glibc
def test_wsgi_application_tunes_the_web_process(tmp_path):
    served = probe(
        "wsgi", DJANGO_SETTINGS_MODULE="config.settings", MADO_SECRET_KEY="x" * 60, MADO_DATA_DIR=str(tmp_path)
    )
    assert served == ["wsgi", "heap", "kept"]
