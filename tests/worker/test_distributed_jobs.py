"""Jobs with several processes (docs/design/worker.md#distributed): the worker starts torchrun, verifies a sharded
checkpoint once before any rank starts, stops every rank on abort and names each rank's exit in the Job's error."""

import json
import sys

import pytest

from jobs.models import JobStatus, RunLogChunk
from jobs.services import run_resume_from_checkpoint
from runs.models import RunStatus
from tests.worker.helpers import make_tar, stored_checkpoint
from tests.worker.test_tasks import abort_when_logged, log_of, workdir_is_gone
from worker.distributed import RankExits, torchrun_argv
from worker.tasks import run_job

SHARDS = {
    ".metadata": b"plan" * 50,
    "__0_0.distcp": b"rank zero" * 100,
    "__1_0.distcp": b"rank one" * 100,
    "mado-checkpoint.json": b'{"format": 1, "framework": "torch-dcp", "step": 20, "world_size": 2}',
}

# What torchrun 2.13 prints when rank 1 exits 3 and it stops rank 0 (trimmed to the report).
REPORT = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_05:15:30
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 15436)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 15436
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_05:15:30
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 15437)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


@pytest.mark.parametrize(
    ("entrypoint", "expected"),
    [
        (
            ["python", "train.py", "--lr", "1"],
            ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", "train.py", "--lr", "1"],
        ),
        (
            ["/venv/bin/python3", "-u", "-X", "dev", "train.py"],
            [
                "/venv/bin/python3",
                "-u",
                "-X",
                "dev",
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "4",
                "train.py",
            ],
        ),
        (
            ["python", "-m", "trainer.main", "--x"],
            [
                "python",
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "4",
                "-m",
                "trainer.main",
                "--x",
            ],
        ),
        (["./train.sh", "a"], ["torchrun", "--standalone", "--nproc-per-node", "4", "--no-python", "./train.sh", "a"]),
    ],
    ids=["script", "interpreter options", "module", "not python"],
)
def test_the_entrypoint_runs_under_torchrun_with_its_own_interpreter(entrypoint, expected):
    assert torchrun_argv(entrypoint, 4) == expected


def test_several_nodes_meet_where_the_rendezvous_options_say():
    rendezvous = ["--nnodes=2", "--master-addr=job-node-0-0.job", "--master-port=29500"]
    assert torchrun_argv(["./train.sh"], 8, rendezvous=rendezvous) == [
        "torchrun",
        *rendezvous,
        "--nproc-per-node",
        "8",
        "--no-python",
        "./train.sh",
    ]


def test_torchrun_report_names_each_rank_first_failure_first():
    exits = RankExits()
    for start in range(0, len(REPORT), 100):  # the log arrives in pieces
        exits.feed(REPORT[start : start + 100])
    assert exits.summary(2, 1) == (
        "torchrun (2 processes) exited with code 1: rank 1 (local rank 1) exited with "
        "code 3 (first failure); rank 0 (local rank 0) was stopped by SIGTERM."
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "rank      : x (local_rank: 0)\n  exitcode  : 1\n",
        "rank : 1 (local_rank: 1)\n" + "exitcode : " + "9" * 5000,
        "\x00\xff" * 50_000,
        REPORT[: len(REPORT) // 2],
    ],
    ids=["empty", "not a number", "huge exit code", "binary", "cut in half"],
)
def test_a_garbled_or_missing_report_still_gives_one_line(text):
    exits = RankExits()
    exits.feed(text)
    summary = exits.summary(2, 1)
    assert summary.startswith("torchrun (2 processes) exited with code 1: ") and "\n" not in summary
    assert len(summary) < 70_000


def test_a_two_process_job_runs_torchrun_and_names_each_failed_rank(launch, control, settings):
    control(exit=3)
    job = launch(nproc_per_node=2)
    assert run_job(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    log = log_of(job)
    assert "'-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '2'" in log
    assert log.count("training code started") == 2  # both ranks ran
    assert job.error.startswith("torchrun (2 processes) exited with code 1: rank ")
    assert "rank 0 (local rank 0)" in job.error and "rank 1 (local rank 1)" in job.error
    assert "exited with code 3 (first failure)" in job.error and job.error in log
    assert job.run.status == RunStatus.FAILED and workdir_is_gone(settings, job)


def test_an_abort_stops_every_rank(launch, control, creator, monkeypatch):
    control(wait=True)
    job = launch(nproc_per_node=2)
    abort_when_logged(monkeypatch, job, creator)
    assert run_job(job.pk) == JobStatus.ABORTED
    job.refresh_from_db()
    assert job.run.status == RunStatus.ABORTED
    assert log_of(job).count("SIGTERM received, saving and exiting") >= 2


def resume_from(failed_source_job, creator, stored: bytes, nproc_per_node: int):
    checkpoint = stored_checkpoint(failed_source_job.run, 20, SHARDS, stored=stored)
    checkpoint.framework, checkpoint.world_size = "torch-dcp", 2
    checkpoint.save(update_fields=["framework", "world_size"])
    return run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint, nproc_per_node=nproc_per_node), checkpoint


def test_a_sharded_checkpoint_is_restored_once_read_only_for_every_rank(failed_source_job, creator, control):
    marker = control()
    job, checkpoint = resume_from(failed_source_job, creator, make_tar(SHARDS), nproc_per_node=2)
    assert job.nproc_per_node == 2
    assert run_job(job.pk) == JobStatus.SUCCEEDED
    seen = json.loads(marker.read_text())
    assert {path: data.encode("latin-1") for path, data in seen["files"].items()} == SHARDS
    assert seen["modes"]["__1_0.distcp"] == "0o444" and seen["env"]["WORLD_SIZE"] == "2"
    log = log_of(job)
    assert log.count(f"[mado] checkpoint {checkpoint.pk} (step 20): 4 files") == 1
    assert "once, read-only, for all 2 ranks" in log


def test_a_shard_tampered_in_storage_fails_the_job_before_any_rank_starts(failed_source_job, creator, control):
    marker = control()
    tampered = make_tar({**SHARDS, "__1_0.distcp": b"X" + SHARDS["__1_0.distcp"][1:]})
    job, checkpoint = resume_from(failed_source_job, creator, tampered, nproc_per_node=2)
    assert run_job(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert job.error.startswith(f"Checkpoint {checkpoint.pk} sha256 mismatch: ") and "__1_0.distcp" in job.error
    assert job.exit_code is None and not marker.exists(), "a rank started although a shard did not verify"
    assert not RunLogChunk.objects.filter(run_id=job.run_id, text__contains="[mado] starting").exists()


def test_the_entrypoint_of_a_one_process_job_is_not_wrapped(launch, control):
    control()
    job = launch()
    assert job.nproc_per_node == 1
    assert run_job(job.pk) == JobStatus.SUCCEEDED
    assert f"[mado] starting [{sys.executable!r}, 'train.py'" in log_of(job)
