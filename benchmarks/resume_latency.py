"""Resume latency: from the resume request to the first line of the resumed code.

Prints figures, asserts nothing. On a fresh ``MADO_DATA_DIR`` (SQLite file, file-system artifact storage)
this process migrates, registers a tiny Code whose first statement records ``time.time()``, and starts one
real Celery worker (``--pool solo``) on a queue of its own, with the Redis broker of ``--broker`` when it
answers, else the embedded filesystem broker. A warm-up Job runs first (worker imports, connections). Then,
per ``--size-mib``:

1. a Job that failed (claimed and finished here, inside the transaction that launches it, so the worker
   skips its message) and a complete checkpoint of its Run: one file of random bytes plus a small JSON,
   stored through the checkpoint services (register, upload, complete), as the SDK's upload would; then
   ``os.sync()``, so the setup's dirty pages do not throttle the worker's writes;
2. one hashlib SHA-256 pass over the checkpoint's tar (1 MiB reads, page cache warm as for the worker):
   the reference rate;
3. ``job_resume_from_latest`` (the service behind the button and ``POST jobs/{id}/resume-latest/``),
   then the code's first-line timestamp and the Job's records.

Phases, from what the worker records: ``dispatch`` (the request — the service's transaction and the send
on commit, also printed alone — and the broker's delivery, up to the claim, ``Job.started_at``), ``code``
(the Code archive fetched and extracted), ``restore`` (the worker's ``[mado] checkpoint …`` log line:
"downloaded, verified and extracted in X s (N bytes written)": one streaming pass, the tar never stored),
``start`` (token, environment, ``Popen``, interpreter start until the code's first line). "Overhead" is the
total minus the restore; "rate" is the checkpoint's tar bytes over the restore, also as a fraction of the
hashlib rate. The bytes the worker wrote are printed twice: its own count of file bytes, and the growth of
the worker process's ``/proc/<pid>/io`` ``wchar`` (every ``write``) and ``write_bytes`` (sent to the block
device; 0 on tmpfs) across the resume: one write of the checkpoint's bytes, not two. Last, the worker
process's peak RSS (``VmHWM``, over its whole life).

    .venv/bin/python benchmarks/resume_latency.py --size-mib 64          # develop with this
    .venv/bin/python benchmarks/resume_latency.py                        # 1 MiB and 1 GiB (≈ 5 GiB of disk)
    .venv/bin/python benchmarks/resume_latency.py --broker filesystem:// --workdir /dev/shm
"""

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
FIRST_LINE = (
    "import time; STARTED = time.time()  # the first line: the benchmark measures up to here\n"
    "import os, sys\n"
    "with open(os.path.join(sys.argv[1], os.environ['MMT_RUN_ID']), 'w') as out:\n"
    "    out.write(repr(STARTED))\n"
)
CHECKPOINT_LINE = re.compile(r"downloaded, verified and extracted in ([0-9.]+) s \(([0-9]+) bytes written\)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size-mib",
        type=int,
        nargs="+",
        default=[1, 1024],
        help="checkpoint sizes in MiB, one measurement each (default: 1 1024)",
    )
    parser.add_argument(
        "--broker",
        default="redis://127.0.0.1:6379/14",
        help="Celery broker; falls back to the filesystem broker when Redis does not answer",
    )
    parser.add_argument("--workdir", default=None, help="where the data directory goes (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    return parser.parse_args()


def choose_broker(url: str) -> str:
    if url.startswith("redis"):
        import redis

        try:
            redis.Redis.from_url(url, socket_connect_timeout=2).ping()
        except redis.exceptions.ConnectionError:
            print(f"Redis does not answer at {url}: using the filesystem broker")
            return "filesystem://"
    return url


def setup_django(data_dir: Path, broker: str) -> None:
    for name in [n for n in os.environ if n.startswith(("MADO_", "CELERY_", "MMT_"))]:
        del os.environ[name]
    os.environ.update(
        {
            "MADO_DATA_DIR": str(data_dir),
            "CELERY_BROKER_URL": broker,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "MADO_WORKER_GPUS": "none",
        }
    )
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_fixture(stamps: Path):
    """User, project, queue and a Code version whose first line records the time; returns them."""
    from django.contrib.auth import get_user_model

    from checkpoints.services import code_version_create_with_archive
    from jobs.models import Queue
    from runs.models import Code, Membership, Project, Role

    user = get_user_model().objects.create_user("bench")
    project = Project.objects.create(name="Bench", slug="bench")
    Membership.objects.create(user=user, project=project, role=Role.MEMBER)
    queue = Queue.objects.create(name=f"bench-{uuid.uuid4().hex[:8]}")
    code = Code.objects.create(project=project, name="first-line", created_by=user)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        info = tarfile.TarInfo("first_line.py")
        info.size = len(FIRST_LINE)
        tar.addfile(info, io.BytesIO(FIRST_LINE.encode()))
    archive.seek(0)
    entrypoint = [sys.executable, "first_line.py", str(stamps)]
    version = code_version_create_with_archive(
        actor=user, code=code, entrypoint=entrypoint, archive=archive, archive_name="code.tar.gz"
    )
    return user, queue, version


def start_worker(queue: str, log: Path) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "config",
        "worker",
        "-Q",
        queue,
        "--pool",
        "solo",
        "--concurrency",
        "1",
        "--hostname",
        "bench@%h",
        "--without-gossip",
        "--without-mingle",
        "--loglevel",
        "INFO",
    ]
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv, cwd=ROOT, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def wait_for(path: Path, worker: subprocess.Popen, log: Path, timeout: float = 600.0) -> float:
    """The timestamp the code wrote to ``path``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            return float(path.read_text())
        if worker.poll() is not None:
            sys.exit(f"the worker exited:\n{log.read_text()[-4000:]}")
        time.sleep(0.002)
    sys.exit(f"no first line after {timeout:.0f} s:\n{log.read_text()[-4000:]}")


def wait_final(job_id: int, timeout: float = 600.0):
    from jobs.models import Job

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = Job.objects.select_related("run").get(pk=job_id)
        if job.is_final:
            return job
        time.sleep(0.05)
    sys.exit(f"job {job_id} did not end within {timeout:.0f} s")


def write_checkpoint_tar(directory: Path, size_mib: int) -> tuple[Path, list[dict]]:
    """A tar of ``model.bin`` (``size_mib`` MiB of random bytes, written 1 MiB at a time) and ``meta.json``."""
    directory.mkdir(parents=True)
    model, digest = directory / "model.bin", hashlib.sha256()
    with open(model, "wb") as out:
        for _ in range(size_mib):
            block = os.urandom(MIB)
            digest.update(block)
            out.write(block)
    meta = json.dumps({"size_mib": size_mib}).encode()
    (directory / "meta.json").write_bytes(meta)
    tar_path = directory.with_suffix(".tar")
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(model, arcname="model.bin")
        tar.add(directory / "meta.json", arcname="meta.json")
    shutil.rmtree(directory)
    manifest = [
        {"path": "meta.json", "size": len(meta), "sha256": hashlib.sha256(meta).hexdigest()},
        {"path": "model.bin", "size": size_mib * MIB, "sha256": digest.hexdigest()},
    ]
    return tar_path, manifest


def sha256_pass(path: Path) -> tuple[str, float, float]:
    """The file's SHA-256, and the pass's wall-clock and CPU seconds (1 MiB reads)."""
    digest, started, cpu = hashlib.sha256(), time.perf_counter(), time.thread_time()
    with open(path, "rb") as source:
        while block := source.read(MIB):
            digest.update(block)
    return digest.hexdigest(), time.perf_counter() - started, time.thread_time() - cpu


def failed_job_with_checkpoint(user, queue, version, tar_path: Path, tar_sha256: str, manifest: list[dict]):
    from django.db import transaction

    from checkpoints.services import checkpoint_complete, checkpoint_register, checkpoint_upload
    from jobs.services import job_claim, job_finish, job_launch

    with transaction.atomic():  # its message leaves after the claim: the worker skips it
        job = job_launch(
            actor=user, code_version=version, queue=queue, parameters={}, dataset_version_ids=[], name="source"
        )
        job_claim(job_id=job.pk, worker_host="bench-setup")
        checkpoint, _ = checkpoint_register(
            actor=user, run=job.run, step=20, framework="bench", idempotency_key=uuid.uuid4().hex
        )
        size = tar_path.stat().st_size
        with open(tar_path, "rb") as body:
            checkpoint_upload(actor=user, checkpoint=checkpoint, source=body, expected_size=size)
        checkpoint_complete(actor=user, checkpoint=checkpoint, tar_size=size, tar_sha256=tar_sha256, manifest=manifest)
        job = job_finish(job_id=job.pk, exit_code=1)
    return job


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory (``VmHWM``) in MiB; 0 when the kernel does not say."""
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0.0
    return int(line.split()[1]) / 1024


def process_io(pid: int) -> dict[str, int]:
    """``/proc/<pid>/io`` counters (bytes); empty when the kernel does not expose them."""
    try:
        lines = Path(f"/proc/{pid}/io").read_text().splitlines()
    except OSError:
        return {}
    return {name: int(value) for name, value in (line.split(": ") for line in lines)}


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (``/proc/<pid>/stat``); 0 if unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(user, queue, version, stamps: Path, worker, log: Path, size_mib: int, scratch: Path) -> dict:
    from jobs.models import RunLogChunk
    from jobs.services import job_resume_from_latest

    tar_path, manifest = write_checkpoint_tar(scratch / f"ckpt-{size_mib}", size_mib)
    tar_sha256, sha_seconds, sha_cpu = sha256_pass(tar_path)
    tar_size = tar_path.stat().st_size
    source = failed_job_with_checkpoint(user, queue, version, tar_path, tar_sha256, manifest)
    tar_path.unlink()
    # The setup's writes (random file, tar, stored copy) go to disk first: in real use the checkpoint was
    # uploaded long before the resume, and their writeback must not throttle the worker's own writes.
    os.sync()
    time.sleep(1.0)  # the source Job's own message reaches the worker and is skipped before we start the clock

    io_before = process_io(worker.pid)
    cpu_before = process_cpu_s(worker.pid)
    requested = time.time()
    job = job_resume_from_latest(actor=user, job=source)
    service_s = time.time() - requested
    first_line = wait_for(stamps / job.run.external_id, worker, log)
    job = wait_final(job.pk)
    io_after = process_io(worker.pid)
    worker_cpu = process_cpu_s(worker.pid) - cpu_before
    worker_peak = peak_rss_mib(worker.pid)
    chunk = next(
        c for c in RunLogChunk.objects.filter(run_id=job.run_id).order_by("seq") if CHECKPOINT_LINE.search(c.text)
    )
    found = CHECKPOINT_LINE.search(chunk.text)
    moved, written = float(found.group(1)), int(found.group(2))
    prepared = chunk.created_at.timestamp()
    started = job.started_at.timestamp()
    phases = {
        "dispatch": started - requested,
        "code": prepared - moved - started,
        "restore": moved,
        "start": first_line - prepared,
    }
    total = first_line - requested
    io = {name: io_after[name] - io_before[name] for name in ("wchar", "write_bytes") if name in io_after}
    return {
        "size_mib": size_mib,
        "tar_bytes": tar_size,
        "status": job.status,
        "phases": phases,
        "total": total,
        "service": service_s,
        "written": written,
        "io": io,
        "worker_peak_mib": worker_peak,
        "worker_cpu": worker_cpu,
        "sha_cpu": sha_cpu,
        "load": os.getloadavg(),
        "overhead": total - moved,
        "rate": tar_size / moved / 1e6 if moved else float("inf"),
        "sha_rate": tar_size / sha_seconds / 1e6,
    }


def report(result: dict) -> None:
    phases = "  ".join(f"{name} {seconds:.3f}" for name, seconds in result["phases"].items())
    ratio = result["rate"] / result["sha_rate"] if result["sha_rate"] else 0
    print(f"{result['size_mib']:>5} MiB checkpoint (tar {result['tar_bytes']} bytes), Job {result['status']}")
    print(f"      request → first line of the code: {result['total']:.3f} s   [{phases}] s")
    print(f"      (the resume service call itself, inside dispatch: {result['service']:.3f} s)")
    print(f"      overhead beyond moving the bytes: {result['overhead']:.3f} s")
    print(
        f"      download+verify+extract (one pass): {result['rate']:.0f} MB/s; hashlib SHA-256 single pass: "
        f"{result['sha_rate']:.0f} MB/s; ratio {ratio:.0%}"
    )
    io = ", ".join(f"{name} +{value:,}" for name, value in result["io"].items()) or "not exposed"
    print(
        f"      bytes written by the worker: {result['written']:,} file bytes "
        f"({result['written'] / result['tar_bytes']:.2f}"
        f" x the tar); worker process /proc io across the resume: {io}"
    )
    print(f"      worker peak RSS (VmHWM since it started): {result['worker_peak_mib']:.0f} MiB")
    # CPU seconds do not depend on who else runs: the worker's whole resume (claim, code, restore, start) against
    # the hashlib pass's seconds (one core, so its CPU seconds), per GiB of tar.
    gib = result["tar_bytes"] / (1 << 30)
    print(
        f"      worker CPU across the resume: {result['worker_cpu'] / gib:.2f} s/GiB (the SHA-256 pass: "
        f"{result['sha_cpu'] / gib:.2f} s/GiB); load average {', '.join(f'{x:.1f}' for x in result['load'])} "
        f"on {os.cpu_count()} CPUs"
    )


def main() -> None:
    args = parse_args()
    base = Path(args.workdir or tempfile.gettempdir())
    workdir = Path(tempfile.mkdtemp(prefix="mado-resume-latency-", dir=base))
    broker = choose_broker(args.broker)
    worker = None
    try:
        setup_django(workdir / "data", broker)
        stamps = workdir / "stamps"
        stamps.mkdir()
        user, queue, version = make_fixture(stamps)
        log = workdir / "worker.log"
        worker = start_worker(queue.name, log)
        from jobs.services import job_launch

        warm = job_launch(
            actor=user, code_version=version, queue=queue, parameters={}, dataset_version_ids=[], name="warm-up"
        )
        wait_for(stamps / warm.run.external_id, worker, log, timeout=120)
        wait_final(warm.pk)
        print(f"broker {broker.split('://')[0]}, SQLite and file storage under {workdir}, worker queue {queue.name}")
        for size_mib in args.size_mib:
            report(measure(user, queue, version, stamps, worker, log, size_mib, workdir))
    finally:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
