"""``benchmarks/gpu_check.sh`` says plainly that there is no GPU to check (and runs nothing), and its rates
script measures a sharded save, the worker's verified restore and the load back on CPU ranks
(docs/design/worker.md#distributed)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
NO_GPU = 3


def fake_nvidia_smi(directory: Path, lines: list[str]) -> Path:
    """A ``nvidia-smi`` that prints ``lines`` (what ``nvidia-smi -L`` lists) and nothing else."""
    directory.mkdir()
    program = directory / "nvidia-smi"
    program.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in lines))
    program.chmod(0o755)
    return directory


def run_script(path: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT)],
        env={"PATH": path, "HOME": "/nonexistent", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_without_nvidia_smi_it_exits_with_a_clear_message(tmp_path):
    done = run_script("/usr/bin:/bin")
    assert done.returncode == NO_GPU
    assert "no GPU visible (nvidia-smi not found)" in done.stderr and done.stdout == ""


def test_a_driver_without_gpus_is_no_gpu(tmp_path):
    fake = fake_nvidia_smi(tmp_path / "bin", [])
    done = run_script(f"{fake}:/usr/bin:/bin")
    assert done.returncode == NO_GPU and "nvidia-smi -L lists none" in done.stderr


def test_gpus_hidden_by_cuda_visible_devices_are_not_visible(tmp_path):
    fake = fake_nvidia_smi(tmp_path / "bin", ["GPU 0: NVIDIA H200 (UUID: GPU-1)", "GPU 1: NVIDIA H200 (UUID: GPU-2)"])
    done = run_script(f"{fake}:/usr/bin:/bin", CUDA_VISIBLE_DEVICES="")
    assert done.returncode == NO_GPU and "visible through CUDA_VISIBLE_DEVICES" in done.stderr
    assert done.stdout == "", "nothing was started"


@pytest.mark.parametrize("visible, expected", [(None, "3"), ("0", "1"), ("0,2", "2")])
def test_it_starts_one_process_per_visible_gpu(tmp_path, visible, expected):
    fake = fake_nvidia_smi(tmp_path / "bin", [f"GPU {index}: NVIDIA H200" for index in range(3)])
    python = fake / "python"
    python.write_text('#!/bin/sh\necho "driver: $*"\n')
    python.chmod(0o755)
    env = {"PYTHON": str(python), "GPU_CHECK_SIZE_MIB": "64"}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    done = run_script(f"{fake}:/usr/bin:/bin", **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith(f"gpu_check: {expected} visible GPU(s)")
    assert f"driver: benchmarks/gpu_check.py --nproc-per-node {expected} --size-mib 64" in done.stdout


def test_the_rates_script_saves_restores_and_loads_a_sharded_checkpoint_on_cpu_ranks(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(ROOT / "benchmarks" / "gpu_checkpoint_rates.py"),
            "--cpu",
            "--size-mib",
            "4",
            "--workdir",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "gpu_check: 2 ranks on CPU (gloo), 4 MiB per rank, 8 MiB in all" in out
    for line in ("checkpoint save (", "checkpoint restore (", "reference: hashlib", "checkpoint load ("):
        assert line in out and "MB/s" in out.split(line, 1)[1].splitlines()[0], out
    assert "tensors loaded back identical to those saved: yes" in out
    assert "mado save" not in out, "without a server only the local figures"
    assert [p for p in tmp_path.iterdir()] == [], "the work directory is removed"


def test_the_script_is_executable():
    assert os.access(SCRIPT, os.X_OK)


@pytest.mark.slow
def test_the_driver_runs_the_ddp_example_and_prints_every_rate_on_cpu_ranks(tmp_path):
    """What ``gpu_check.sh`` starts on a GPU machine, on 2 CPU ranks: the example against a server, then the rates
    on local disk and through mado (about a minute)."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check.py"),
            "--nproc-per-node",
            "2",
            "--size-mib",
            "4",
            "--cpu",
            "--workdir",
            str(tmp_path),
        ],
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "complete checkpoints: step 40 (world size 2, " in out
    for label in (
        "checkpoint save (",
        "checkpoint restore (",
        "checkpoint load (",
        "mado save (",
        "mado restore (",
        "mado load (",
    ):
        assert label in out and "MB/s" in out.split(label, 1)[1].splitlines()[0], out
    assert "tensors loaded back identical to those saved: yes" in out
    assert list(tmp_path.iterdir()) == [], "the data directory and checkpoints are removed"
