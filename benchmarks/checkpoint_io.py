"""Checkpoint save / download benchmark: prints figures, asserts nothing.

Starts gunicorn (2 sync workers) on a fresh SQLite data directory with the
file-system artifact storage, writes ``--files`` files of random bytes
(``--size-mib`` in all, written in 1 MiB chunks so the generation holds no
more than that), then, in the same run:

- a single SHA-256 pass over the same files with ``hashlib`` (1 MiB reads):
  the reference rate;
- the SDK's side alone: the checkpoint's tar stream read to the end without
  sending it (each file read once and its SHA-256 computed; the tar's is
  the server's);
- ``CheckpointVerifier`` over the checkpoint's tar (read from a file) with
  each number of hash threads of ``--threads`` (default 1 and 2), each
  beside a single SHA-256 pass over the same tar: how verification scales
  with the cores;
- ``run.log_checkpoint`` through the SDK: tar + every file's SHA-256 +
  upload + the server's streaming check (every file's and the tar's
  SHA-256) + complete, ``--save-repeats`` times at successive steps, as a
  training job saves (the median, and each; the first save also pays the
  first request of a fresh gunicorn worker and of the SDK's connection;
  the server keeps every one, so the work directory needs that many times
  the checkpoint's size);
- ``mado_tracking.download_checkpoint``: the tar back to a file, SHA-256 checked;
- ``mado agent``'s restore (``mado_tracking.extract.restore_checkpoint``):
  download, verify and extract in one streaming pass, the tar never stored;
- a plain copy of the same files (1 MiB reads and writes) in the same
  directory: the disk's write rate, which bounds the download (the client
  writes it);
- the same bytes written as one blob through the server's storage
  (``DurableFileSystemStorage``: on disk, ``fsync``ed, before it returns),
  nothing hashed or sent: the floor of a save, which answers only once the
  tar is durable;
- the training-loop stall of a background save: a model of ``--size-mib``
  float32 parameters written into a directory (by
  ``mado_tracking.torch.save_checkpoint``, then by a plain ``torch.save``)
  plus ``run.log_checkpoint(..., wait=False)``, against a plain
  ``torch.save`` of the same state dict to a local file timed right after
  (``--stall-repeats`` times, ``os.sync()`` before each save; medians, and
  the median of the per-repeat ratios), then how long each upload ran on
  after the call returned.

Each phase starts after ``os.sync()`` (so it does not pay for the previous
one's dirty-page writeback) and its CPU seconds per GiB are printed for the
SDK (this process) and the server (the gunicorn processes).

Prints MB/s (10^6 bytes per second, of the files' total size) for each, the
save rate as a fraction of the single-pass rate, the peak RSS of this
process around the save and the download (``/proc/self/status`` VmHWM,
reset through ``/proc/self/clear_refs`` before each), and the peak RSS of
the gunicorn processes (VmHWM, over the whole run).

    .venv/bin/python benchmarks/checkpoint_io.py                 # 1 GiB in 8 files
    .venv/bin/python benchmarks/checkpoint_io.py --size-mib 256
    .venv/bin/python benchmarks/checkpoint_io.py --workdir /dev/shm   # files and server data in memory
    .venv/bin/python benchmarks/checkpoint_io.py --threads 1 2 4 --verification-only
"""

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from metrics_ingest import ROOT, free_port, peak_rss_mib, prepare, server_pids, wait_for_server  # noqa: E402

sys.path.insert(0, str(ROOT))  # the server's storage, for the durable-write floor

from verification_rates import MIB, verification_rates  # noqa: E402


def write_random_files(directory: Path, count: int, total_mib: int) -> int:
    """``count`` files of random bytes, ``total_mib`` MiB in all, written 1 MiB at a time; returns the bytes."""
    directory.mkdir(parents=True)
    sizes = [total_mib // count + (1 if index < total_mib % count else 0) for index in range(count)]
    for index, size_mib in enumerate(sizes):
        with open(directory / f"shard-{index:02d}.bin", "wb") as handle:
            for _ in range(size_mib):
                handle.write(os.urandom(MIB))
    return sum(sizes) * MIB


def sha256_single_pass(directory: Path) -> float:
    """Seconds for one hashlib SHA-256 pass over every file, 1 MiB reads."""
    started = time.perf_counter()
    for path in sorted(directory.iterdir()):
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(MIB):
                digest.update(chunk)
    return time.perf_counter() - started


def plain_copy(directory: Path, target: Path) -> float:
    """Seconds to copy every file with 1 MiB reads and writes (the disk's write rate for this data)."""
    target.mkdir()
    started = time.perf_counter()
    for path in sorted(directory.iterdir()):
        with open(path, "rb") as source, open(target / path.name, "wb") as sink:
            while chunk := source.read(MIB):
                sink.write(chunk)
    elapsed = time.perf_counter() - started
    shutil.rmtree(target)
    return elapsed


class _Concatenated:
    """The files of ``directory``, in name order, read as one stream (``read(n)``, 1 MiB at a time)."""

    def __init__(self, directory: Path):
        self._paths = sorted(directory.iterdir())
        self._handle = None

    def read(self, size: int = -1) -> bytes:
        while True:
            if self._handle is None:
                if not self._paths:
                    return b""
                self._handle = open(self._paths.pop(0), "rb")
            data = self._handle.read(min(size, MIB) if size > 0 else MIB)
            if data:
                return data
            self._handle.close()
            self._handle = None


def durable_write(directory: Path, target: Path) -> float:
    """Seconds to write every file of ``directory`` as one blob through the server's storage, fsync included."""
    from django.conf import settings
    from django.core.files import File

    if not settings.configured:
        settings.configure()
    from checkpoints.filesystem import DurableFileSystemStorage

    storage = DurableFileSystemStorage(location=target)
    started = time.perf_counter()
    storage.save("blob", File(_Concatenated(directory), name="blob"))
    elapsed = time.perf_counter() - started
    shutil.rmtree(target)
    return elapsed


def sdk_side_alone(directory: Path) -> float:
    """Seconds to read the SDK's tar stream of ``directory`` to the end (every hash computed, nothing sent)."""
    from mado_tracking.tarstream import CheckpointTar

    started = time.perf_counter()
    for _ in CheckpointTar(directory):
        pass
    return time.perf_counter() - started


def cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """User and system CPU seconds used so far by the processes ``pids`` (all their threads; /proc/<pid>/stat)."""
    ticks = os.sysconf("SC_CLK_TCK")
    user = system = 0.0
    for pid in pids:
        if pid == os.getpid():
            times = os.times()
            user, system = user + times.user, system + times.system
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user, system = user + int(fields[11]) / ticks, system + int(fields[12]) / ticks  # fields 14, 15 of stat
    return user, system


class CpuMeter:
    """CPU seconds per GiB of checkpoint, this process (the SDK) and the server's processes, around a phase.

    Wall-clock rates on a machine others load say little; CPU seconds per
    GiB on each side do not depend on who else runs (``os.sync()`` first, so a
    phase does not pay for the previous one's dirty-page writeback). System
    time is printed apart: on a virtual machine whose host hands memory back
    and forth (a balloon), first touching a page costs kernel time that the
    same code does not pay elsewhere.
    """

    def __init__(self, server: list[int], total: int):
        self._server = server
        self._gib = total / (1 << 30)
        self.lines: list[str] = []

    def __call__(self, name: str, repeats: int = 1):
        """A context manager measuring phase ``name``, which handles the checkpoint ``repeats`` times."""
        meter = self
        gib = self._gib * repeats

        class _Phase:
            def __enter__(self):
                os.sync()
                self.sdk, self.server = cpu_seconds([os.getpid()]), cpu_seconds(meter._server)
                return self

            def __exit__(self, *exc):
                sdk = [(now - then) / gib for now, then in zip(cpu_seconds([os.getpid()]), self.sdk)]
                server = [(now - then) / gib for now, then in zip(cpu_seconds(meter._server), self.server)]
                meter.lines.append(
                    f"CPU of {name}: SDK {sum(sdk):.2f} s/GiB (system {sdk[1]:.2f}), server {sum(server):.2f} s/GiB "
                    f"(system {server[1]:.2f}), together {sum(sdk) + sum(server):.2f} s/GiB"
                )

        return _Phase()


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux ≥ 4.0); False when not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def own_peak_rss_mib() -> float:
    return peak_rss_mib([os.getpid()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="checkpoint size in MiB (default 1024)")
    parser.add_argument("--files", type=int, default=8, help="number of files (default 8)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers (default 2)")
    parser.add_argument("--workdir", default=None, help="where the files and the server's data go (default: $TMPDIR)")
    parser.add_argument(
        "--save-repeats",
        type=int,
        default=5,
        help="saves of the checkpoint, each at its own step (default 5); the figure is their median",
    )
    parser.add_argument("--stall-repeats", type=int, default=5, help="repeats of the stall figures (default 5)")
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1, 2],
        help="hash threads of the verification rates (default 1 2; MADO_HASH_THREADS sets the rest)",
    )
    parser.add_argument("--verify-repeats", type=int, default=3, help="repeats of each verification rate (default 3)")
    parser.add_argument(
        "--verification-only", action="store_true", help="print the verification rates only (no server)"
    )
    args = parser.parse_args()
    if args.save_repeats < 1:
        parser.error("--save-repeats must be at least 1")

    work = Path(tempfile.mkdtemp(prefix="mado-ckpt-bench-", dir=args.workdir))
    if args.verification_only:
        try:
            write_random_files(work / "ckpt", args.files, args.size_mib)
            verification_rates(work / "ckpt", work, args.threads, args.verify_repeats)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    env = {**os.environ, "MADO_DATA_DIR": str(work / "data")}
    env.pop("MADO_STORAGE", None)
    try:
        token = prepare(env)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "config.wsgi:application",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                str(args.workers),
                "--timeout",
                "600",
                "--log-level",
                "warning",
            ],
            env=env,
            cwd=ROOT,
        )
        try:
            wait_for_server(url)
            run_benchmark(url, token, work, args, server.pid)
        finally:
            server.terminate()
            server.wait(timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_benchmark(url: str, token: str, work: Path, args, server_pid: int) -> None:
    import mado_tracking

    checkpoint_dir = work / "ckpt"
    total = write_random_files(checkpoint_dir, args.files, args.size_mib)
    generated_peak = own_peak_rss_mib()
    cpu = CpuMeter(server_pids(server_pid), total)
    with cpu("one hashlib SHA-256 pass"):
        hash_s = sha256_single_pass(checkpoint_dir)
    os.sync()
    copy_s = plain_copy(checkpoint_dir, work / "copy")
    os.sync()
    durable_s = durable_write(checkpoint_dir, work / "durable")
    with cpu("the SDK side alone"):
        client_s = sdk_side_alone(checkpoint_dir)
    verification_rates(checkpoint_dir, work, args.threads, args.verify_repeats)

    run = mado_tracking.start_run(project="bench", name="checkpoint-io", api_url=url, api_token=token)
    reset = reset_peak_rss()
    before_save = own_peak_rss_mib()
    saves = []
    with cpu("save (log_checkpoint), mean per save", repeats=args.save_repeats):
        for step in range(args.save_repeats):
            os.sync()
            started = time.perf_counter()
            saved = run.log_checkpoint(checkpoint_dir, step=step, includes_optimizer=False, framework="bench")
            saves.append(time.perf_counter() - started)
    save_s = statistics.median(saves)
    save_peak = own_peak_rss_mib()
    run.finish()

    reset_peak_rss()
    with cpu("download (download_checkpoint)"):
        started = time.perf_counter()
        mado_tracking.download_checkpoint(saved.id, work / "downloaded.tar", api_url=url, api_token=token)
        download_s = time.perf_counter() - started
    download_peak = own_peak_rss_mib()
    server_peak = peak_rss_mib(server_pids(server_pid))

    rate = lambda seconds: total / seconds / 1e6  # noqa: E731
    print(
        f"checkpoint: {args.files} files, {total / MIB:,.0f} MiB ({total / 1e6:,.0f} MB); tar {saved.tar_size:,} bytes"
    )
    print(f"work directory: {work}")
    print(f"hashlib SHA-256 single pass (1 MiB reads): {rate(hash_s):,.0f} MB/s ({hash_s:.2f} s)")
    print(f"plain copy of the files there (1 MiB reads + writes): {rate(copy_s):,.0f} MB/s ({copy_s:.2f} s)")
    print(
        f"durable write of the same bytes (the server's storage: on disk and fsynced before it returns; nothing "
        f"hashed or sent): {rate(durable_s):,.0f} MB/s ({durable_s:.2f} s) = {hash_s / durable_s:.0%} of the "
        f"single-pass rate: no save can be faster here"
    )
    print(
        f"SDK side alone (tar stream + each file's SHA-256, nothing sent): {rate(client_s):,.0f} MB/s "
        f"({client_s:.2f} s) = {hash_s / client_s:.0%} of the single-pass rate"
    )
    print(
        f"save (log_checkpoint: tar + file SHA-256 + upload + server check with file and tar SHA-256 + complete), "
        f"median of {len(saves)}: {rate(save_s):,.0f} MB/s ({save_s:.2f} s) = {hash_s / save_s:.0%} of the "
        f"single-pass rate (all {', '.join(f'{hash_s / s:.0%}' for s in saves)})"
    )
    print(
        f"download (download_checkpoint: stream to file + SHA-256 check): {rate(download_s):,.0f} MB/s "
        f"({download_s:.2f} s)"
    )
    where = "around the call, VmHWM reset before" if reset else "lifetime VmHWM: clear_refs unavailable"
    print(
        f"SDK peak RSS ({where}): save {save_peak:.0f} MiB (before {before_save:.0f} MiB), "
        f"download {download_peak:.0f} MiB; after writing the files {generated_peak:.0f} MiB"
    )
    print(f"server peak RSS (largest gunicorn process, VmHWM): {server_peak:.0f} MiB")
    (work / "downloaded.tar").unlink()
    with cpu("restore (mado agent)"):
        measure_restore(url, token, work, saved.id, total, hash_s)
    print("\n".join(cpu.lines))
    print("(each phase starts after os.sync(), so it does not pay for the previous one's writeback)")
    measure_stall(url, token, work, args)


def measure_restore(url: str, token: str, work: Path, checkpoint_id: int, total: int, hash_s: float) -> None:
    """``mado agent``'s restore: download + verify (format, every file's and the tar's SHA-256) + extract, one pass."""
    from mado_tracking import config
    from mado_tracking.client import ApiClient
    from mado_tracking.extract import restore_checkpoint

    client = ApiClient(config.resolve(api_url=url, api_token=token, require_project=False))
    target = work / "restored"
    target.mkdir()
    reset = reset_peak_rss()
    before = own_peak_rss_mib()
    started = time.perf_counter()
    restore_checkpoint(client, checkpoint_id, target)
    restore_s = time.perf_counter() - started
    peak = own_peak_rss_mib()
    client.close()
    written = sum(p.stat().st_size for p in (target / "checkpoint").rglob("*") if p.is_file())
    print(
        f"restore (download + verify + extract in one pass, the tar never stored): "
        f"{total / restore_s / 1e6:,.0f} MB/s ({restore_s:.2f} s) = {hash_s / restore_s:.0%} of the single-pass "
        f"rate; {written:,} bytes of files written; SDK peak RSS {peak:.0f} MiB (before {before:.0f} MiB"
        f"{'' if reset else ', lifetime VmHWM'})"
    )


def big_model(size_mib: int):
    """A module of float32 parameters of ``size_mib`` MiB in all (64 MiB each at most), random values."""
    import torch

    sizes = [64] * (size_mib // 64) + ([size_mib % 64] if size_mib % 64 else [])
    return torch.nn.ParameterList(torch.nn.Parameter(torch.randn(mib * MIB // 4)) for mib in sizes)


def measure_stall(url: str, token: str, work: Path, args) -> None:
    """Print the training-loop stall of ``log_checkpoint(wait=False)`` against a plain ``torch.save``.

    Two ways to write the directory: ``mado_tracking.torch.save_checkpoint``
    (read-only files renamed into place: snapshotted by hard links) and a
    plain ``torch.save`` into the directory (writable: snapshotted by copy).
    """
    import torch

    import mado_tracking
    from mado_tracking.torch import save_checkpoint

    model = big_model(args.size_mib)
    writers = {
        "save_checkpoint": lambda path, step: save_checkpoint(path, model=model, step=step),
        "torch.save": lambda path, step: torch.save(model.state_dict(), _fresh(path) / "model.pt"),
    }
    times = {name: [] for name in ("plain", *writers, *(f"{name} call" for name in writers), "upload")}
    run = mado_tracking.start_run(project="bench", name="checkpoint-stall", api_url=url, api_token=token)
    step = 0
    for _ in range(args.stall_repeats):
        for name, write in writers.items():
            step += 1
            os.sync()
            started = time.perf_counter()
            write(work / "stall-ckpt", step)
            called = time.perf_counter()
            future = run.log_checkpoint(work / "stall-ckpt", step=step, framework="torch", wait=False)
            returned = time.perf_counter()
            times[name].append(returned - started)
            times[f"{name} call"].append(returned - called)
            future.result()  # training would go on meanwhile; the next save comes after this one is up
            times["upload"].append(time.perf_counter() - returned)
        os.sync()  # each timed save starts with no dirty pages of the one before
        started = time.perf_counter()
        torch.save(model.state_dict(), _fresh(work / "plain") / "model.pt")
        times["plain"].append(time.perf_counter() - started)
    run.finish()
    listed = {name: ", ".join(f"{value:.2f}" for value in values) for name, values in times.items()}
    print(
        f"plain torch.save of the {args.size_mib} MiB state dict to local disk: median "
        f"{statistics.median(times['plain']):.2f} s (all {listed['plain']})"
    )
    for name in writers:
        # Each repeat times the three saves back to back: their ratio is steadier than ratios of medians
        # on a machine that others load; the best of each is the least disturbed figure.
        ratios = [mine / plain for mine, plain in zip(times[name], times["plain"])]
        print(
            f"stall of {name} + log_checkpoint(wait=False): median {statistics.median(times[name]):.2f} s "
            f"(all {listed[name]}); best {min(times[name]):.2f} s = {min(times[name]) / min(times['plain']):.2f}x "
            f"the best plain torch.save; median ratio to the plain torch.save of the same repeat "
            f"{statistics.median(ratios):.2f}x (all {', '.join(f'{ratio:.2f}' for ratio in ratios)}); "
            f"of which log_checkpoint(wait=False) itself: {listed[f'{name} call']} s"
        )
    print(f"the background uploads then ran {listed['upload']} s after the call returned")


def _fresh(directory: Path) -> Path:
    directory.mkdir(exist_ok=True)
    for path in directory.iterdir():
        path.unlink()
    return directory


if __name__ == "__main__":
    main()
