"""Input that is small on the wire and large inside is refused or accepted the same way everywhere, in bounded memory
and time (docs/checkpoint-format.md#limits-settings; docs/design/checkpoints.md#tar-format).

Hypothesis builds hostile tars (paths thousands of levels deep, thousands of members under distinct deep prefixes,
long names in PAX and GNU headers, case and file/directory clashes) and hostile manifests, each at most 2 MB, and feeds
them to every path that reads them: upload + ``complete``, the direct-to-S3 verification, the worker's restore, the
SDK's restore; a manifest also to ``complete`` with no upload and to the SDK's file-by-file restore check. Every
input gets one verdict, and no path allocates 64 MB more than it started with (tracemalloc) or takes long.
"""

import itertools
import json
import random
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoints.services.declaration import clean_declaration
from mado.errors import ValidationFailed
from mado_tracking.errors import CheckpointError
from mado_tracking.extract import _manifest_files, _mismatch
from mado_tracking.tarformat import Limits
from tests.checkpoints.tar_corpus import END, Case, member
from tests.checkpoints.test_tar_corpus import direct_verdict, sdk_verdict, server_verdict, worker_verdict

pytestmark = pytest.mark.django_db
BUDGET = 2_000_000  # bytes: the largest generated tar or manifest body
EXTRA_MEMORY = 64 * 1024 * 1024  # bytes allocated at peak by one path, over what it started with
SECONDS = 120  # per path and input under tracemalloc: a bound on runaway work, not a speed figure (a loaded 2-core
# machine took 55.7 s once for a 1.6 MB tar of many entries on the worker path; benchmarks/ hold the speed figures)
DEEP = 64  # MADO_TAR_MAX_DEPTH's default
_numbers = itertools.count(10**6)


def measured(call):
    """``(result, peak bytes allocated, seconds)`` of ``call()``."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        result = call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return result, peak, time.monotonic() - started


def paths_of(seed: int, shape: str, depth: int, count: int) -> list[str]:
    """``count`` paths of ``depth`` levels: one chain shared by all (``chain``), a distinct tree per path
    (``fan``: the worst for memory kept per directory), or random short names (``mixed``)."""
    rnd = random.Random(seed)
    found = []
    for index in range(count):
        if shape == "chain":
            parts = ["a"] * (depth - 1) + [f"f{index}"]
        elif shape == "fan":
            parts = [f"{index:x}"] + ["d"] * max(depth - 2, 0) + ["f"] * (depth > 1)
        else:
            parts = [rnd.choice("abc") for _ in range(depth - 1)] + [f"m{index}"]
        found.append("/".join(parts))
    return found


CLASHES = {
    None: lambda first: None,
    "case": lambda first: first.upper() if first.upper() != first else None,
    "dup": lambda first: first,
    "file-dir": lambda first: first.rsplit("/", 1)[0] if "/" in first else None,
    "dir-spelling": lambda first: first[0].upper() + first[1:] + "/other" if first[:1].isalpha() else None,
}


@st.composite
def hostile_tars(draw) -> Case:
    shape = draw(st.sampled_from(["chain", "fan", "mixed"]))
    depth = draw(st.one_of(st.integers(1, DEEP), st.integers(DEEP + 1, 2000)))
    count = draw(st.integers(1, 4000))
    encoding = draw(st.sampled_from(["ustar", "pax", "gnu"]))
    clash = draw(st.sampled_from(list(CLASHES)))
    paths = paths_of(draw(st.integers(0, 2**32)), shape, depth, count)
    extra = CLASHES[clash](paths[0])
    chunks, files, size = [], {}, len(END)
    for path in [*paths, *([extra] if extra else [])]:
        data = path.encode()[:7]
        chunk = member(path, data, encoding)
        if size + len(chunk) > BUDGET:
            extra = None  # the clash did not fit
            break
        chunks.append(chunk)
        files.setdefault(path, data)
        size += len(chunk)
    refused = extra is not None or depth > DEEP or any(len(p.encode()) > 4096 for p in files)
    return Case(b"".join(chunks) + END, files, not refused)


@pytest.mark.slow
@pytest.mark.timeout(900, func_only=True)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=hostile_tars())
def test_hostile_tars_get_one_verdict_everywhere_in_bounded_memory_and_time(api, creator, run, tmp_path, case):
    client = api(creator)
    paths = {
        "server": lambda: server_verdict(client, run, case),
        "direct": lambda: direct_verdict(creator, run, case),
        "worker": lambda: worker_verdict(run, case, tmp_path / f"job-{next(_numbers)}"),
        "sdk": lambda: sdk_verdict(case, tmp_path / f"agent-{next(_numbers)}"),
    }
    found = {}
    for name, call in paths.items():
        found[name], peak, seconds = measured(call)
        assert peak < EXTRA_MEMORY, f"{name}: {peak} bytes allocated at peak for a {len(case.tar)}-byte tar"
        assert seconds < SECONDS, f"{name}: {seconds:.1f} s for a {len(case.tar)}-byte tar"
    assert found == dict.fromkeys(paths, case.accept), found


@st.composite
def hostile_manifests(draw) -> list[dict]:
    shape = draw(st.sampled_from(["chain", "fan", "mixed"]))
    depth = draw(st.one_of(st.integers(1, DEEP), st.integers(DEEP + 1, 2000)))
    count = draw(st.integers(1, 20000))
    clash = draw(st.sampled_from(list(CLASHES)))
    paths = paths_of(draw(st.integers(0, 2**32)), shape, depth, count)
    extra = CLASHES[clash](paths[0])
    entries, size = [], 0
    for path in [*paths, *([extra] if extra else [])]:
        entry = {"path": path, "size": 1, "sha256": "0" * 64}
        size += len(json.dumps(entry)) + 2
        if size > BUDGET:
            break
        entries.append(entry)
    return entries


def sdk_manifest_verdict(entries: list[dict]) -> bool:
    try:
        _manifest_files(entries, Limits(), _mismatch(9))
    except CheckpointError as exc:
        assert str(exc).startswith("Checkpoint 9 "), exc
        return False
    return True


def direct_manifest_verdict(entries: list[dict]) -> bool:
    try:
        clean_declaration(tar_size=1, tar_sha256=None, manifest=entries, manifest_sha256=None)
    except ValidationFailed:
        return False
    return True


@pytest.mark.slow
@pytest.mark.timeout(900, func_only=True)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=hostile_manifests())
def test_hostile_manifests_get_one_verdict_everywhere_in_bounded_memory_and_time(api, creator, run, entries):
    """``complete`` with no upload answers 400 naming the manifest when it refuses it, else 409 (nothing uploaded)."""
    client = api(creator)
    created = client.post(f"/api/v1/runs/{run.pk}/checkpoints/", {"step": next(_numbers)}, format="json")
    cid = created.json()["id"]

    def server() -> bool:
        done = client.post(f"/api/v1/checkpoints/{cid}/complete/", {"tar_size": 1, "manifest": entries}, format="json")
        assert done.status_code in (400, 409), done.content
        return done.status_code == 409

    found = {}
    for name, call in {"server": server, "direct": lambda: direct_manifest_verdict(entries)}.items():
        found[name], peak, seconds = measured(call)
        assert peak < EXTRA_MEMORY, f"{name}: {peak} bytes allocated at peak for {len(entries)} entries"
        assert seconds < SECONDS, f"{name}: {seconds:.1f} s for {len(entries)} entries"
    found["sdk"] = sdk_manifest_verdict(entries)
    assert len(set(found.values())) == 1, found
