"""``mado sweep create | show`` against the live server and ``mado agent`` against a scripted sweep API
(docs/design/sweeps.md#sweeps, #requeue). The agent runs as a real process, so signals reach it as they would on a
preemptible machine; its trials run a tiny program that records its arguments, environment and signals.
tests/e2e/test_sweep_preemption.py runs agents, the example and a real server together."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mado_tracking.cli import main
from mado_tracking.tarstream import CheckpointTar
from tests.sdk.sweep_stub import TOKEN, SweepStub

MADO = str(Path(sys.executable).parent / "mado")
EXAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "sweep.yaml"

TRIAL_PROGRAM = """
import json, os, signal, sys, time
from pathlib import Path
import mado_tracking

out = Path(os.environ["TRIAL_OUT"]) / os.environ["MMT_RUN_ID"]
record = {"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items() if k.startswith("MMT_")}}
checkpoint = mado_tracking.resume_checkpoint()
if checkpoint is not None:
    record["resume"] = {"step": checkpoint.step, "id": checkpoint.id, "source_run_id": checkpoint.source_run_id,
                        "path": str(checkpoint.path),
                        "files": {p.relative_to(checkpoint.path).as_posix(): p.read_text()
                                  for p in checkpoint.path.rglob("*") if p.is_file()}}
mode, received = os.environ.get("TRIAL_MODE", ""), []
if mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif mode == "record":
    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(signum, lambda n, f: received.append(n))
Path(f"{out}.tmp").write_text(json.dumps(record))
os.rename(f"{out}.tmp", f"{out}.json")
if os.environ.get("TRIAL_EXIT"):
    sys.exit(int(os.environ["TRIAL_EXIT"]))
if mode:
    deadline = time.monotonic() + 30
    while not received and time.monotonic() < deadline:
        time.sleep(0.02)
    Path(f"{out}.signals").write_text(json.dumps(received))
    sys.exit(1)
"""


def trial(number: int, **extra) -> dict:
    return {
        "trial": {
            "number": number,
            "parameters": {"lr": 0.01, "hidden": 32},
            "run_id": 100 + number,
            "external_id": f"trial-{number}",
            "requeue_count": 0,
            "lease_expires_at": None,
            "latest_checkpoint": None,
            **extra,
        },
        "done": False,
    }


@pytest.fixture
def trial_out(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    return out


@pytest.fixture
def stub(tmp_path):
    """``stub(claims)``: a running ``SweepStub`` for sweep 7 whose program is ``TRIAL_PROGRAM``."""
    script = tmp_path / "trial.py"
    script.write_text(TRIAL_PROGRAM)
    started = []

    def make(claims: list[dict]) -> SweepStub:
        found = SweepStub(program=[sys.executable, str(script)], claims=claims).__enter__()
        started.append(found)
        return found

    yield make
    for found in started:
        found.__exit__(None, None, None)


def start_agent(
    stub: SweepStub, trial_out: Path, *args: str, mode: str = "", sweep: int = 7, **env: str
) -> subprocess.Popen:
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MMT_")},
        "MMT_API_URL": stub.url,
        "MMT_API_TOKEN": TOKEN,
        "TRIAL_OUT": str(trial_out),
        "TRIAL_MODE": mode,
        **env,
    }
    return subprocess.Popen(
        [MADO, "agent", str(sweep), "--poll-interval", "0.05", *args],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(agent: subprocess.Popen) -> tuple[int, str, str]:
    out, err = agent.communicate(timeout=60)
    return agent.returncode, out, err


def wait_for(path: Path, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return json.loads(path.read_text())


def test_the_agent_runs_each_claimed_trial_with_its_parameters_and_run_id_until_the_sweep_is_done(stub, trial_out):
    api = stub(
        [
            trial(1, parameters={"lr": 0.01, "hidden": 32, "act": "relu", "wide": True}),
            {"trial": None, "done": False},
            trial(2),
        ]
    )
    code, out, err = finish(start_agent(api, trial_out, MMT_RESUME_STEP="3", MMT_MODE="offline"))
    assert code == 0, err
    assert "sweep 7 is done: cap reached" in out
    first = json.loads((trial_out / "trial-1.json").read_text())
    assert first["argv"] == ["--lr=0.01", "--hidden=32", "--act=relu", "--wide=true"]
    assert first["env"] == {
        "MMT_RUN_ID": "trial-1",
        "MMT_RESUME": "allow",
        "MMT_SWEEP_ID": "7",
        "MMT_PROJECT": "vision",
        "MMT_API_URL": api.url,
        "MMT_API_TOKEN": TOKEN,
    }
    assert (trial_out / "trial-2.json").exists()
    name = api.agents[0]
    host, pid = name.rsplit(":", 1)
    assert host and int(pid) > 0
    assert api.reports == [
        (1, {"exit_code": 0, "preempted": False, "agent": name}),
        (2, {"exit_code": 0, "preempted": False, "agent": name}),
    ]
    assert api.agents == [name] * 4  # two trials, one empty answer, then done


def test_count_stops_the_agent_after_n_trials(stub, trial_out):
    api = stub([trial(1), trial(2)])
    code, out, _ = finish(start_agent(api, trial_out, "--count", "1"))
    assert (code, api.reports) == (0, [(1, {"exit_code": 0, "preempted": False, "agent": api.agents[0]})])
    assert "1 trial(s) ran" in out and len(api.agents) == 1


def test_the_agent_stops_after_max_failures_trials_in_a_row_failed(stub, trial_out):
    api = stub([trial(1), trial(2), trial(3), trial(4)])
    code, _, err = finish(start_agent(api, trial_out, "--max-failures", "2", TRIAL_EXIT="3"))
    assert code == 1
    assert "2 trials in a row failed; stopping this agent (--max-failures 2)" in err
    assert [number for number, _ in api.reports] == [1, 2]  # trials 3 and 4 are left for a mended program


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_forwarded_preemption_signal_reaches_the_program_is_reported_and_ends_the_agent(stub, trial_out, signum):
    api = stub([trial(1), trial(2)])
    agent = start_agent(api, trial_out, "--forward-signals", mode="record")
    wait_for(trial_out / "trial-1.json")
    agent.send_signal(signum)
    code, _, err = finish(agent)
    assert json.loads((trial_out / "trial-1.signals").read_text()) == [signum]
    assert api.reports == [(1, {"exit_code": 1, "preempted": True, "agent": api.agents[0]})]
    assert (code, len(api.agents)) == (128 + signum, 1)  # trial 2 is never claimed
    assert f"stopped by {signal.Signals(signum).name}" in err


def test_a_forwarded_sigint_stops_the_agent_without_calling_the_trial_preempted(stub, trial_out):
    api = stub([trial(1), trial(2)])
    agent = start_agent(api, trial_out, "--forward-signals", mode="record")
    wait_for(trial_out / "trial-1.json")
    agent.send_signal(signal.SIGINT)
    code, _, _ = finish(agent)
    assert json.loads((trial_out / "trial-1.signals").read_text()) == [signal.SIGINT]
    assert (code, api.reports) == (130, [(1, {"exit_code": 1, "preempted": False, "agent": api.agents[0]})])


def test_a_program_that_ignores_sigterm_is_killed_after_the_grace(stub, trial_out):
    api = stub([trial(1)])
    agent = start_agent(api, trial_out, "--forward-signals", "--kill-grace", "0.3", mode="ignore")
    wait_for(trial_out / "trial-1.json")
    started = time.monotonic()
    agent.send_signal(signal.SIGTERM)
    code, _, err = finish(agent)
    assert time.monotonic() - started < 10
    assert (code, api.reports) == (
        143,
        [(1, {"exit_code": -signal.SIGKILL, "preempted": True, "agent": api.agents[0]})],
    )
    assert "still running 0.3 s after SIGTERM; SIGKILL" in err


def test_sigterm_while_waiting_for_a_trial_stops_the_agent(stub, trial_out):
    api = stub([{"trial": None, "done": False}] * 1000)
    agent = start_agent(api, trial_out, "--forward-signals")
    deadline = time.monotonic() + 30
    while len(api.agents) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    agent.send_signal(signal.SIGTERM)
    code, _, _ = finish(agent)
    assert (code, api.reports) == (143, [])


def checkpoint_tar(directory: Path) -> tuple[bytes, dict]:
    tar = CheckpointTar(directory, tar_hash=True)  # its SHA-256: what the server records
    data = b"".join(tar)
    return data, {"tar_size": len(data), "tar_sha256": tar.sha256, "manifest": tar.manifest}


def test_a_requeued_trial_resumes_from_its_checkpoint_downloaded_verified_and_extracted(stub, trial_out, tmp_path):
    saved = tmp_path / "saved"
    (saved / "nested").mkdir(parents=True)
    (saved / "model.pt").write_text("weights at step 20")
    (saved / "nested" / "rng.pt").write_text("rng state")
    data, described = checkpoint_tar(saved)
    api = stub([trial(3, requeue_count=1, latest_checkpoint={"id": 55, "step": 20})])
    api.checkpoints[55] = ({"id": 55, "run_id": 103, "step": 20, "state": "complete", **described}, data)
    code, out, err = finish(start_agent(api, trial_out, MMT_RESUME_STEP="7"))
    assert code == 0, err
    resume = json.loads((trial_out / "trial-3.json").read_text())["resume"]
    assert {key: resume[key] for key in ("step", "id", "source_run_id")} == {"step": 20, "id": 55, "source_run_id": 103}
    assert resume["files"] == {"model.pt": "weights at step 20", "nested/rng.pt": "rng state"}
    assert not Path(resume["path"]).exists()  # the agent removes it once the trial has ended
    assert "trial 3: resuming run trial-3 from checkpoint 55 (step 20)" in out
    assert "requeued 1x" in out


def test_sigterm_while_the_checkpoint_downloads_requeues_the_trial_without_starting_the_program(
    stub, trial_out, tmp_path
):
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "model.pt").write_text("weights at step 20")
    data, described = checkpoint_tar(saved)
    api = stub([trial(3, latest_checkpoint={"id": 55, "step": 20}), trial(4)])
    api.checkpoints[55] = ({"id": 55, "run_id": 103, "step": 20, "state": "complete", **described}, data)
    api.tar_delay = 1.0
    agent = start_agent(api, trial_out, "--forward-signals")
    assert api.tar_requested.wait(30)
    agent.send_signal(signal.SIGTERM)
    code, out, _ = finish(agent)
    assert (code, api.reports) == (
        143,
        [(3, {"exit_code": -signal.SIGTERM, "preempted": True, "agent": api.agents[0]})],
    )
    assert "trial 3 was not started: SIGTERM came first (preempted)" in out
    assert not (trial_out / "trial-3.json").exists() and len(api.agents) == 1


def test_a_checkpoint_that_does_not_match_its_sha256_stops_the_agent_before_the_program_starts(
    stub, trial_out, tmp_path
):
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "model.pt").write_text("weights at step 20")
    data, described = checkpoint_tar(saved)
    api = stub([trial(3, latest_checkpoint={"id": 55, "step": 20})])
    api.checkpoints[55] = (
        {"id": 55, "run_id": 103, "step": 20, "state": "complete", **described},
        data.replace(b"weights", b"WEIGHTS"),
    )
    code, _, err = finish(start_agent(api, trial_out))
    assert code == 1
    assert "Checkpoint 55 sha256 mismatch: 'model.pt'" in err
    assert not (trial_out / "trial-3.json").exists() and api.reports == []


def test_a_sweep_the_server_refuses_exits_1_with_the_servers_reason_before_any_claim(stub, trial_out):
    api = stub([])
    code, _, err = finish(start_agent(api, trial_out, sweep=8))
    assert code == 1
    assert "agent on sweep 8: nothing at /api/v1/sweeps/8/ (HTTP 404 not_found)" in err
    assert api.agents == []


# --- mado sweep create | show against the live server ------------------------------------------------------


@pytest.fixture
def mado(live_server, member, project, token_of):
    """``mado(*args)``: the command line as ``member`` of ``vision`` against the live server."""

    def invoke(*args):
        env = {"MMT_API_URL": live_server.url, "MMT_API_TOKEN": token_of(member), "MMT_PROJECT": None}
        return CliRunner().invoke(main, [str(arg) for arg in args], env=env, catch_exceptions=False)

    return invoke


@pytest.mark.django_db(transaction=True)
def test_sweep_create_prints_the_id_page_and_agent_command(mado, live_server):
    created = mado("sweep", "create", EXAMPLE_CONFIG, "--project", "vision")
    assert created.exit_code == 0, created.output
    lines = created.output.splitlines()
    sweep_id = int(lines[0].split()[1])
    assert "grid search, minimize val_loss, at most 4 trials" in lines[0]
    assert lines[1].startswith(live_server.url) and lines[1].endswith(f"/{sweep_id}/")
    assert lines[2] == f"run its trials with: mado agent {sweep_id}"
    quiet = mado("sweep", "create", EXAMPLE_CONFIG, "--project", "vision", "-q")
    assert quiet.output.strip() == str(sweep_id + 1)


@pytest.mark.django_db(transaction=True)
def test_sweep_create_shows_the_refused_field(mado, tmp_path):
    config = tmp_path / "bad.json"
    config.write_text(
        json.dumps(
            {
                "method": "annealing",
                "metric": {"name": "val_loss", "goal": "minimize"},
                "parameters": {"lr": {"values": [0.1]}},
                "program": "python train.py",
            }
        )
    )
    refused = mado("sweep", "create", config, "--project", "vision")
    assert refused.exit_code == 1
    assert f"cannot create a sweep from {config}:" in refused.output and "field method; HTTP 400" in refused.output


def test_sweep_create_refuses_a_file_that_is_not_a_mapping_naming_it(tmp_path):
    config = tmp_path / "list.yaml"
    config.write_text("- method: grid\n")
    refused = CliRunner().invoke(
        main,
        ["sweep", "create", str(config), "--project", "vision"],
        env={"MMT_API_URL": "http://127.0.0.1:9", "MMT_API_TOKEN": "x"},
    )
    assert refused.exit_code == 2
    assert f"{config}: must hold a mapping" in refused.output


@pytest.mark.django_db(transaction=True)
def test_sweep_show_lists_the_trials_and_the_best_one(mado, api, member):
    sweep_id = int(mado("sweep", "create", EXAMPLE_CONFIG, "--project", "vision", "-q").output)
    client = api(member)
    claims = [
        client.post(f"/api/v1/sweeps/{sweep_id}/claim/", {"agent": "box:1"}, format="json").json()["trial"]
        for _ in range(2)
    ]
    started = client.post(
        "/api/v1/runs/",
        {"project": "vision", "external_id": claims[1]["external_id"], "resume": "allow"},
        format="json",
    )
    assert started.status_code == 200, started.content
    logged = client.post(
        f"/api/v1/runs/{claims[1]['run_id']}/metrics/",
        {"points": [{"key": "val_loss", "step": 0, "value": 0.25}]},
        format="json",
    )
    assert logged.status_code == 201, logged.content
    finished = client.patch(f"/api/v1/runs/{claims[1]['run_id']}/", {"status": "finished"}, format="json")
    assert finished.status_code == 200, finished.content
    shown = mado("sweep", "show", sweep_id)
    assert shown.exit_code == 0, shown.output
    assert f"sweep {sweep_id} 'digits-lr-hidden' in project vision: grid search" in shown.output
    assert "program: python examples/sweep_training.py --steps 60 --checkpoint-every 10" in shown.output
    rows = {line.split()[0]: line.split() for line in shown.output.splitlines()[3:]}
    second = f"hidden={claims[1]['parameters']['hidden']} lr={claims[1]['parameters']['lr']}"
    assert rows["1"] == ["1", "leased", "pending", "0", claims[0]["external_id"], "box:1", "hidden=32", "lr=0.01"]
    assert rows["2"] == ["2", "done", "finished", "0", claims[1]["external_id"], "box:1", "0.25", *second.split()]
    assert shown.output.splitlines()[-1] == f"best: trial 2 (val_loss 0.25; {second})"
    missing = mado("sweep", "show", 99999)
    assert missing.exit_code == 1 and "cannot read sweep 99999" in missing.output


@pytest.mark.django_db(transaction=True)
def test_sweep_retry_queues_a_failed_trial_again_and_refuses_a_second_retry(mado, api, member):
    sweep_id = int(mado("sweep", "create", EXAMPLE_CONFIG, "--project", "vision", "-q").output)
    client = api(member)
    claimed = client.post(f"/api/v1/sweeps/{sweep_id}/claim/", {"agent": "box:1"}, format="json").json()["trial"]
    client.post(
        "/api/v1/runs/", {"project": "vision", "external_id": claimed["external_id"], "resume": "allow"}, format="json"
    )
    assert client.patch(f"/api/v1/runs/{claimed['run_id']}/", {"status": "failed"}, format="json").status_code == 200
    retried = mado("sweep", "retry", sweep_id, 1)
    assert retried.exit_code == 0, retried.output
    trial = client.get(f"/api/v1/sweeps/{sweep_id}/").json()["trials"][0]
    assert (trial["state"], trial["run_status"], trial["retry_count"]) == ("queued", "pending", 1)
    assert trial["external_id"] != claimed["external_id"]
    assert retried.output.strip() == (
        f"trial 1 queued again as run {trial['external_id']} (retry 1); run it with: mado agent {sweep_id}"
    )
    again = mado("sweep", "retry", sweep_id, 1)
    assert again.exit_code == 1
    assert f"cannot retry trial 1 of sweep {sweep_id}: trial 1 was already retried" in again.output
    assert "HTTP 409" in again.output
    shown = mado("sweep", "show", sweep_id)  # the failed run stays: the sweep page lists it as an earlier run
    assert claimed["external_id"] not in shown.output.splitlines()[3]
