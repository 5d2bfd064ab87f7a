"""Under torchrun rank 0 fetches the checkpoint of a same-run resume and every rank gets the same directory
(docs/design/resume.md#resume-anywhere; docs/design/worker.md#distributed).

Real torchrun processes (gloo) against a live server, and, for what one machine cannot stage (a rank on
another node, rank 0 failing), the rank side alone with a dict for the process group's store.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import mado_tracking
from mado_tracking import CheckpointError, checkpoint_cache, resume_fetch
from mado_tracking.distributed import RankRun
from mado_tracking.ranks import Ranks
from tests.sdk.resume_stub import ResumeStubApi

PROGRAM = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    import mado_tracking
    from mado_tracking import checkpoint_cache

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 1:  # only rank 0 may download
        def refuse(*args, **kwargs):
            raise AssertionError("rank 1 downloaded")
        checkpoint_cache.fetch = refuse
    with mado_tracking.start_run(id="ranks-1", resume="must") as run:
        found = run.resume_checkpoint()
        assert run.resume_checkpoint() is found
        content = (found.path / "w.bin").read_text()
        sys.stdout.write(json.dumps({"rank": rank, "path": str(found.path), "step": found.step, "id": found.id,
                                     "content": content}) + "\\n")
        sys.stdout.flush()
    dist.destroy_process_group()
""")


@pytest.mark.django_db(transaction=True)
def test_two_ranks_of_a_resumed_run_get_rank_0s_verified_directory(mmt_env, tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "w.bin").write_text("weights at step 5")
    first = mado_tracking.start_run(id="ranks-1")
    saved = first.log_checkpoint(tmp_path / "ckpt", step=5)
    first.finish("failed")
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MMT_")}, **mmt_env}
    work = tmp_path / "elsewhere"
    work.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(program)],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = sorted((json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")), key=lambda x: x["rank"])
    assert [line["rank"] for line in lines] == [0, 1]
    assert lines[0]["path"] == lines[1]["path"] and lines[0]["path"].startswith(str(work / ".mado" / "cache"))
    assert {(line["step"], line["id"], line["content"]) for line in lines} == {(5, saved.id, "weights at step 5")}


class _Store(dict):
    def set(self, key, value):
        self[key] = value

    def wait(self, keys, timeout):
        assert all(key in self for key in keys), "rank 0 never answered"

    def get(self, key):
        return self[key]


def _rank_1(stub, monkeypatch, store) -> RankRun:
    monkeypatch.setattr(resume_fetch, "_store", lambda: store)
    data = {"id": 1, "external_id": "exp-1", "project": "vision", "resumed": True, "fencing_token": 2}
    config = mado_tracking.config.Config(api_url=stub.url, api_token="stub-token", project="vision")
    return RankRun(config=config, data=data, step=27, ranks=Ranks(1, 1, 2), flush_timeout=1.0)


def test_a_rank_that_cannot_see_rank_0s_directory_fetches_the_same_checkpoint_into_its_own_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("MMT_CACHE_DIR", str(tmp_path / "this-node"))
    store = _Store()
    with ResumeStubApi() as stub:
        stub.add_checkpoint(12, 20)
        on_rank_0 = {
            "path": str(tmp_path / "other-node" / "12" / "checkpoint"),
            "step": 20,
            "id": 12,
            "source_run_id": 1,
            "info": {},
            "key": checkpoint_cache.content_key(stub.checkpoints[12]),
        }
        store.set(resume_fetch._KEY.format(1, 2), json.dumps({"found": on_rank_0}))
        run = _rank_1(stub, monkeypatch, store)
        found = run.resume_checkpoint()
        run.finish()
    assert found.path.is_relative_to(tmp_path / "this-node") and (found.step, found.id) == (20, 12)
    assert dict(stub.tar_gets) == {12: 1}


def test_rank_0s_error_is_raised_on_every_rank(monkeypatch, tmp_path):
    store = _Store()
    store.set(
        resume_fetch._KEY.format(1, 2),
        json.dumps({"error": "Checkpoint 12 sha256 mismatch: …", "kind": "CheckpointError"}),
    )
    with ResumeStubApi() as stub:
        run = _rank_1(stub, monkeypatch, store)
        with pytest.raises(CheckpointError, match=r"rank 1: rank 0 could not get .*Checkpoint 12 sha256 mismatch"):
            run.resume_checkpoint()
        run.finish()
