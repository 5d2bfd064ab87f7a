"""Every rank of a torchrun program joins one Run; sharded checkpoints from every rank
(docs/design/worker.md#distributed).

Real torchrun processes (gloo on CPU) against a live server: one Run, rank 0's metrics plus each rank's
``rank<k>/`` series, one Checkpoint with a shard per rank and ``world_size`` 2, loaded back resharded by one
process.
"""

import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
import torch

from checkpoints.models import Checkpoint, CheckpointState
from mado_tracking import ResumeError, start_run
from mado_tracking.distributed import rank_keys, ranks_from_environment
from mado_tracking.errors import MadoError
from mado_tracking.torch import load_distributed
from runs.models import MetricPoint, Run, RunStatus

PROGRAM = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    import mado_tracking
    from mado_tracking.torch import load_distributed

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    with mado_tracking.start_run(name="ddp", parameters={"world_size": 2}) as run:
        for step in range(3):
            run.log_metrics({"loss": float(step)}, step=step)
            run.log_metrics({"loss": 10.0 * rank + step}, step=step, all_ranks=True)
        saved = run.log_checkpoint_distributed({"model": model.state_dict()}, step=3)
        # One write of the whole line: with PYTHONUNBUFFERED, print() writes the text and the newline apart
        # and the other rank's line can land between them.
        sys.stdout.write(json.dumps({"rank": rank, "run": run.id, "checkpoint": saved.id, "step": run.step,
                                     "world_size": run.world_size}) + "\\n")
        sys.stdout.flush()
        if rank == 0:
            with open(sys.argv[1], "w") as out:
                json.dump({k: v.tolist() for k, v in model.state_dict().items()}, out)
    if rank == 0:  # a Run of rank 0 alone: it must not wait for the others
        with mado_tracking.start_run(name="rank 0 only") as solo:
            solo.log_metrics({"loss": 1.0}, step=0)
    dist.destroy_process_group()
""")


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}, None),
        ({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}, (1, 1, 4)),
    ],
)
def test_ranks_come_from_torchrun_variables(environ, expected):
    ranks = ranks_from_environment(environ)
    assert (ranks and (ranks.rank, ranks.local_rank, ranks.world_size)) == expected


@pytest.mark.parametrize(
    "environ",
    [
        {"RANK": "1"},
        {"RANK": "one", "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
        {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
        {"RANK": "0", "LOCAL_RANK": "-1", "WORLD_SIZE": "2"},
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "0"},
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "9" * 5000},
    ],
    ids=["partial", "not a number", "rank too high", "negative", "zero world", "huge"],
)
def test_broken_torchrun_variables_are_named(environ):
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        ranks_from_environment(environ)


def test_per_rank_keys_go_under_the_rank():
    assert rank_keys({"train.loss": 1.0, "acc": 2}, 3) == {"rank3/train.loss": 1.0, "rank3/acc": 2}
    with pytest.raises(TypeError):
        rank_keys([("loss", 1.0)], 0)


def test_a_rank_without_a_process_group_is_told_before_any_request(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(MadoError, match="init_process_group"):
        start_run(project="vision", api_url="http://127.0.0.1:9", api_token="t")


def test_load_distributed_refuses_what_is_not_a_sharded_checkpoint(tmp_path):
    with pytest.raises(ResumeError, match="not resuming"):
        load_distributed({})
    with pytest.raises(ResumeError, match="mado-checkpoint.json"):
        load_distributed({}, tmp_path)
    (tmp_path / "mado-checkpoint.json").write_text(json.dumps({"framework": "torch", "step": 3}))
    with pytest.raises(ResumeError, match="not a torch-dcp checkpoint"):
        load_distributed({}, tmp_path)
    (tmp_path / "mado-checkpoint.json").write_text("[1, 2")
    with pytest.raises(ResumeError, match="mado-checkpoint.json"):
        load_distributed({}, tmp_path)


@pytest.mark.django_db(transaction=True)
def test_two_ranks_share_one_run_and_save_one_sharded_checkpoint(mmt_env, tmp_path, settings):
    program, weights = tmp_path / "program.py", tmp_path / "weights.json"
    program.write_text(PROGRAM)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MMT_")}, **mmt_env}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(program),
            str(weights),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = sorted(
        (json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")), key=lambda line: line["rank"]
    )
    assert [(line["rank"], line["step"], line["world_size"]) for line in lines] == [(0, 3, 2), (1, 3, 2)]
    assert lines[0]["run"] == lines[1]["run"] and lines[0]["checkpoint"] == lines[1]["checkpoint"]
    assert dict(Run.objects.values_list("name", "status")) == {
        "ddp": RunStatus.FINISHED,
        "rank 0 only": RunStatus.FINISHED,
    }
    run = Run.objects.get(name="ddp")
    assert run.pk == lines[0]["run"]
    points = {(p.key, p.step): p.value for p in MetricPoint.objects.filter(run=run)}
    assert points == {
        **{("loss", s): float(s) for s in range(3)},
        **{(f"rank{r}/loss", s): 10.0 * r + s for r in range(2) for s in range(3)},
    }
    checkpoint = Checkpoint.objects.get()
    assert (checkpoint.pk, checkpoint.state, checkpoint.framework, checkpoint.world_size) == (
        lines[0]["checkpoint"],
        CheckpointState.COMPLETE,
        "torch-dcp",
        2,
    )
    assert set(checkpoint.manifest.values_list("path", flat=True)) == {
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "mado-checkpoint.json",
    }
    assert not list((tmp_path / ".mado" / "dcp").rglob("*.distcp")), "the staging directory is left behind"

    restored = tmp_path / "restored"
    restored.mkdir()
    stored_tar = Path(settings.STORAGES["artifacts"]["OPTIONS"]["location"]) / checkpoint.artifact.storage_key
    with tarfile.open(stored_tar) as tar:
        tar.extractall(restored, filter="data")
    state = {"model": torch.nn.Linear(3, 2).state_dict()}  # other weights: the load must replace them
    assert load_distributed(state, restored) == 3  # one process reads what two wrote
    assert {k: v.tolist() for k, v in state["model"].items()} == json.loads(weights.read_text())
