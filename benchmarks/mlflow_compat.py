"""MLflow-compatibility benchmark: prints figures, asserts nothing.

Times the same stock MLflow client (mlflow-skinny from this venv) against
(1) mado (gunicorn, ``--workers`` workers, fresh SQLite data dir) and
(2) a real ``mlflow server`` (SQLite backend store, local artifacts served with
``--serve-artifacts``) started on loopback by this script:

- ``MlflowClient().log_batch`` of ``--points`` metric points, 1,000 per call
  (MLflow's per-request limit);
- ``mlflow.log_artifacts`` of a folder of 8 random-byte files totalling
  ``--size-mib`` MiB (nothing is downloaded).

For each server it prints points/s, artifact MB/s and the resident memory of
the server process tree (sum of VmRSS over the master and all descendants,
and the largest single process,
sampled every 0.2 s in a thread) at the start of and at its peak during each
phase, then the ratios mado/mlflow. Each client run is its own subprocess, so
environment variables and client caches do not leak between servers.

The real server needs the full ``mlflow`` package; it is installed once into a
separate venv at ``var/bench/mlflow-venv`` (never into .venv).

    .venv/bin/python benchmarks/mlflow_compat.py                 # 100,000 points, 1 GiB
    .venv/bin/python benchmarks/mlflow_compat.py --size-mib 256
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
MLFLOW_VENV = ROOT / "var" / "bench" / "mlflow-venv"
BATCH = 1000  # MLflow's limit on metrics per log_batch request
N_FILES = 8
CHUNK = 8 * 1024 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- server memory sampling -------------------------------------------------


def tree_pids(root: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        pid, ppid = (int(x) for x in line.split())
        children.setdefault(ppid, []).append(pid)
    pids, stack = [], [root]
    while stack:
        pid = stack.pop()
        pids.append(pid)
        stack.extend(children.get(pid, []))
    return pids


def tree_rss_mib(root: int) -> tuple[float, float]:
    """(sum of VmRSS over the tree, largest single process), MiB."""
    total = largest = 0
    for pid in tree_pids(root):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    kib = int(line.split()[1])
                    total += kib
                    largest = max(largest, kib)
                    break
        except OSError:
            continue
    return total / 1024, largest / 1024


class RssSampler(threading.Thread):
    """Samples the server tree's RSS every 0.2 s; tracks start and peak per phase."""

    def __init__(self, root: int):
        super().__init__(daemon=True)
        self.root = root
        self.phase: str | None = None
        self.start_rss: dict[str, tuple[float, float]] = {}
        self.peak: dict[str, tuple[float, float]] = {}
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def set_phase(self, phase: str | None) -> None:
        rss = tree_rss_mib(self.root)
        with self.lock:
            self.phase = phase
            if phase:
                self.start_rss[phase] = rss
                self.peak[phase] = rss

    def run(self) -> None:
        while not self.stop.wait(0.2):
            rss = tree_rss_mib(self.root)
            with self.lock:
                if self.phase:
                    old = self.peak[self.phase]
                    self.peak[self.phase] = (max(old[0], rss[0]), max(old[1], rss[1]))


# --- client (runs in its own subprocess) ------------------------------------


def client_main(points: int, folder: str) -> None:
    import mlflow
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    mlflow.set_experiment("bench")
    client = MlflowClient()
    run = mlflow.start_run(run_name="compat")
    run_id = run.info.run_id
    keys = [f"m{i}" for i in range(10)]
    steps_per_batch = BATCH // len(keys)

    print("PHASE metrics", flush=True)
    started = time.perf_counter()
    sent = 0
    step = 0
    while sent < points:
        ts = int(time.time() * 1000)
        batch = [
            Metric(k, 1.0 / (step + s + 1) + j, ts, step + s)
            for s in range(steps_per_batch)
            for j, k in enumerate(keys)
        ][: points - sent]
        client.log_batch(run_id, metrics=batch)
        sent += len(batch)
        step += steps_per_batch
    metrics_s = time.perf_counter() - started

    print("PHASE artifacts", flush=True)
    started = time.perf_counter()
    mlflow.log_artifacts(folder, "data")
    artifacts_s = time.perf_counter() - started
    print("PHASE none", flush=True)
    mlflow.end_run()
    print("RESULT " + json.dumps({"points": sent, "metrics_s": metrics_s, "artifacts_s": artifacts_s}), flush=True)


def run_client(env: dict, points: int, folder: Path, sampler: RssSampler) -> dict:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--client", "--points", str(points), "--folder", str(folder)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    result = None
    for line in proc.stdout:
        if line.startswith("PHASE "):
            phase = line.split()[1]
            sampler.set_phase(None if phase == "none" else phase)
        elif line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
        else:
            print("  client:", line.rstrip())
    proc.wait()
    sampler.set_phase(None)
    if result is None:
        raise SystemExit(f"client failed (exit {proc.returncode})")
    return result


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(extra)
    return env


def wait_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early ({proc.returncode})")
        try:
            if requests.get(url, timeout=5).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise SystemExit(f"server not up after {timeout:.0f} s: {url}")


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


# --- servers ------------------------------------------------------------------


def bench_mado(args, folder: Path, tmp: Path) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from metrics_ingest import prepare

    data_dir = tmp / "mado-data"
    data_dir.mkdir()
    env = {**os.environ, "MADO_DATA_DIR": str(data_dir)}
    env.pop("MADO_DATABASE_URL", None)
    token = prepare(env)
    port = free_port()
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
            "--log-level",
            "warning",
        ],
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/accounts/login/", server, 60)
        return measure(
            server, clean_env(MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}", MLFLOW_TRACKING_TOKEN=token), args, folder
        )
    finally:
        stop(server)


def ensure_mlflow_venv() -> Path:
    mlflow_bin = MLFLOW_VENV / "bin" / "mlflow"
    python = MLFLOW_VENV / "bin" / "python"
    if not (
        python.exists()
        and subprocess.run([str(python), "-c", "import mlflow.server, flask, alembic"], capture_output=True).returncode
        == 0
    ):
        print(f"creating {MLFLOW_VENV} with mlflow>=3,<4 (once) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(MLFLOW_VENV)], check=True)
        subprocess.run([str(MLFLOW_VENV / "bin" / "pip"), "install", "-q", "mlflow>=3,<4"], check=True)
    return mlflow_bin


def bench_mlflow(args, folder: Path, tmp: Path) -> dict:
    mlflow_bin = ensure_mlflow_venv()
    version = subprocess.run(
        [str(MLFLOW_VENV / "bin" / "python"), "-c", "import mlflow; print(mlflow.__version__)"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"mlflow server version: {version}")
    port = free_port()
    server = subprocess.Popen(
        [
            str(mlflow_bin),
            "server",
            "--backend-store-uri",
            f"sqlite:///{tmp}/mlflow.db",
            "--artifacts-destination",
            str(tmp / "artifacts"),
            "--serve-artifacts",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(args.workers),
        ],
        env=clean_env(),
        cwd=tmp,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "mlflow-server.log", "w"),
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", server, 180)
        return measure(server, clean_env(MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}"), args, folder)
    finally:
        stop(server)


def measure(server: subprocess.Popen, env: dict, args, folder: Path) -> dict:
    sampler = RssSampler(server.pid)
    sampler.start()
    try:
        result = run_client(env, args.points, folder, sampler)
    finally:
        sampler.stop.set()
    result["rss_start"] = sampler.start_rss
    result["rss_peak"] = sampler.peak
    return result


def make_folder(path: Path, size_mib: int) -> int:
    path.mkdir()
    per_file = size_mib * 1024 * 1024 // N_FILES
    for i in range(N_FILES):
        with open(path / f"shard-{i}.bin", "wb") as f:
            left = per_file
            while left:
                n = min(CHUNK, left)
                f.write(os.urandom(n))
                left -= n
    return per_file * N_FILES


def report(name: str, r: dict, total_bytes: int) -> dict:
    def rss(phase: str) -> str:
        (s0, l0), (s1, l1) = r["rss_start"][phase], r["rss_peak"][phase]
        return f"server RSS tree-sum {s0:.0f} -> peak {s1:.0f} MiB (largest process {l0:.0f} -> {l1:.0f})"

    pps = r["points"] / r["metrics_s"]
    mbs = total_bytes / 1e6 / r["artifacts_s"]
    print(f"{name}:")
    print(f"  log_batch:     {r['points']:,} points in {r['metrics_s']:.2f} s = {pps:,.0f} points/s; " + rss("metrics"))
    print(
        f"  log_artifacts: {total_bytes / 2**20:,.0f} MiB in {r['artifacts_s']:.2f} s = {mbs:,.1f} MB/s; "
        + rss("artifacts")
    )
    return {"pps": pps, "mbs": mbs, "rss": r["rss_peak"]["artifacts"][0], "rss_largest": r["rss_peak"]["artifacts"][1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", choices=["mado", "mlflow"], help="run against one server only (no ratios)")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(args.points, args.folder)
        return

    tmp = Path(tempfile.mkdtemp(prefix="mado-mlflow-bench-"))
    try:
        folder = tmp / "upload"
        total_bytes = make_folder(folder, args.size_mib)
        import mlflow

        print(
            f"client: mlflow-skinny {mlflow.__version__}; {args.points:,} points, "
            f"{N_FILES} files totalling {total_bytes / 2**20:,.0f} MiB; {args.workers} server workers"
        )
        mado = real = None
        if args.only != "mlflow":
            mado = bench_mado(args, folder, tmp)
            if args.only == "mado":
                report("mado (gunicorn, SQLite)", mado, total_bytes)
        if args.only != "mado":
            (tmp / "mlflow").mkdir()
            real = bench_mlflow(args, folder, tmp / "mlflow")
            if mado:
                m = report("mado (gunicorn, SQLite)", mado, total_bytes)
            f = report("mlflow server (SQLite, local artifacts)", real, total_bytes)
        if not (mado and real):
            return
        print("ratios mado/mlflow:")
        print(
            f"  points/s {m['pps'] / f['pps']:.2f}x, artifact MB/s {m['mbs'] / f['mbs']:.2f}x, "
            f"peak RSS during upload {m['rss'] / f['rss']:.2f}x (tree sum), "
            f"{m['rss_largest'] / f['rss_largest']:.2f}x (largest process)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
