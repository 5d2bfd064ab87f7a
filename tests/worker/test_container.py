"""The container runner builds the ``docker run`` equivalent of the subprocess runner
(docs/design/worker.md#extract, #subprocess). No Docker engine is needed: only the argv and environment it builds are
checked."""

from pathlib import Path

import pytest

from worker.container import (
    CONTAINER_CHECKPOINT_DIR,
    CONTAINER_RESUME_FILE,
    check_gpus_setting,
    container_env,
    cuda_visible_devices,
    docker_gpus_args,
    docker_kill_argv,
    docker_run_argv,
)
from worker.runner import child_env

WORK = Path("/var/mado/jobs/job-42")


def build(**overrides):
    arguments = dict(
        job_id=42,
        image="ghcr.io/acme/train:1.2",
        argv=["python", "train.py", "--steps", "40"],
        env_names=["MMT_API_URL", "MMT_API_TOKEN", "MMT_RUN_ID", "PYTHONUNBUFFERED"],
        code_dir=WORK / "code",
        checkpoint_dir=WORK / "checkpoint",
        resume_file=WORK / "resume-checkpoint.json",
        gpus="0,1",
    )
    arguments.update(overrides)
    return docker_run_argv(**arguments)


def option_values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, part in enumerate(argv) if part == option]


def test_the_docker_run_command_mounts_the_checkpoint_read_only():
    argv = build()
    assert argv[:3] == ["docker", "run", "--rm"]
    assert argv[-5:] == ["ghcr.io/acme/train:1.2", "python", "train.py", "--steps", "40"]
    assert option_values(argv, "--mount") == [
        "type=bind,source=/var/mado/jobs/job-42/code,target=/mmt/code",
        f"type=bind,source=/var/mado/jobs/job-42/checkpoint,target={CONTAINER_CHECKPOINT_DIR},readonly",
        f"type=bind,source=/var/mado/jobs/job-42/resume-checkpoint.json,target={CONTAINER_RESUME_FILE},readonly",
    ]
    assert option_values(argv, "--workdir") == ["/mmt/code"]
    assert option_values(argv, "--name") == ["mado-job-42"]
    assert "--init" in argv  # SIGTERM from the runner reaches the code as PID 1's child
    assert option_values(argv, "--gpus") == ['"device=0,1"']


def test_variables_are_passed_by_name_so_the_token_never_shows_in_a_process_listing():
    argv = build()
    assert option_values(argv, "--env") == ["MMT_API_TOKEN", "MMT_API_URL", "MMT_RUN_ID", "PYTHONUNBUFFERED"]
    assert not any("=" in value for value in option_values(argv, "--env"))


def test_a_new_job_mounts_no_checkpoint():
    argv = build(checkpoint_dir=None, resume_file=None)
    assert len(option_values(argv, "--mount")) == 1
    assert "/mmt/inputs" not in " ".join(argv)


def test_inside_the_container_the_resume_variables_point_at_the_mounts():
    variables = {
        "MMT_RUN_ID": "r1",
        "MMT_RESUME_CHECKPOINT_DIR": str(WORK / "checkpoint"),
        "MMT_RESUME_STEP": "20",
        "MMT_RESUME_CHECKPOINT_FILE": str(WORK / "resume-checkpoint.json"),
        "CUDA_VISIBLE_DEVICES": "3",
    }
    inside = container_env(variables)
    assert inside == {
        "MMT_RUN_ID": "r1",
        "MMT_RESUME_CHECKPOINT_DIR": "/mmt/inputs/checkpoint",
        "MMT_RESUME_STEP": "20",
        "MMT_RESUME_CHECKPOINT_FILE": "/mmt/inputs/resume-checkpoint.json",
    }


def test_the_docker_client_gets_the_values_and_its_own_variables_only(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/docker.sock")
    monkeypatch.setenv("MADO_SECRET_KEY", "secret")
    env = child_env({"MMT_API_TOKEN": "tok"}, passthrough=("DOCKER_HOST",))
    assert env["DOCKER_HOST"] == "unix:///run/docker.sock" and env["MMT_API_TOKEN"] == "tok"
    assert "MADO_SECRET_KEY" not in env


@pytest.mark.parametrize(
    "setting, worker_env, devices, gpus",
    [
        ("0,1", {}, "0,1", ['"device=0,1"']),
        ("GPU-8a1b-22", {}, "GPU-8a1b-22", ['"device=GPU-8a1b-22"']),
        ("all", {"CUDA_VISIBLE_DEVICES": "2"}, None, ["all"]),
        ("none", {"CUDA_VISIBLE_DEVICES": "2"}, "", []),
        ("", {"CUDA_VISIBLE_DEVICES": "2,3"}, "2,3", ['"device=2,3"']),
        ("", {}, None, []),
    ],
)
def test_gpu_assignment_follows_the_worker_setting(setting, worker_env, devices, gpus):
    assert cuda_visible_devices(setting, worker_env) == devices
    assert option_values(docker_gpus_args(setting, worker_env), "--gpus") == gpus


@pytest.mark.parametrize("bad", ["0;rm -rf /", "0, 1", "--privileged", "0,,1", "device=0"])
def test_a_bad_gpu_setting_is_refused(bad):
    with pytest.raises(ValueError, match="MADO_WORKER_GPUS"):
        check_gpus_setting(bad)


@pytest.mark.parametrize(
    "overrides",
    [
        {"image": ""},
        {"image": "--privileged"},
        {"argv": []},
        {"argv": "python train.py"},
        {"code_dir": Path("/work/a,b")},
        {"checkpoint_dir": Path("relative/dir")},
    ],
)
def test_unusable_input_is_refused(overrides):
    with pytest.raises(ValueError):
        build(**overrides)


def test_a_killed_client_s_container_is_removed_by_name():
    assert docker_kill_argv(42) == ["docker", "rm", "--force", "mado-job-42"]


@pytest.mark.django_db
def test_a_container_queue_runs_the_entrypoint_through_docker_run(failed_source_job, creator, settings, monkeypatch):
    from jobs.models import Queue
    from jobs.services import run_resume_from_checkpoint
    from tests.worker.helpers import stored_checkpoint
    from worker.execute import Prepared, code_variables, command

    monkeypatch.setenv("MADO_SECRET_KEY", "server-secret")
    settings.MADO_WORKER_GPUS = "2,3"
    gpu = Queue.objects.create(name="gpu-a100", runner="container", image="ghcr.io/acme/train:1")
    checkpoint = stored_checkpoint(failed_source_job.run, 20)
    job = run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint, queue=gpu)
    work = settings.MADO_WORKER_WORKDIR / f"job-{job.pk}"
    prepared = Prepared(
        code_dir=work / "code", checkpoint_dir=work / "checkpoint", resume_file=work / "resume-checkpoint.json", step=20
    )
    variables = code_variables(job, prepared, "run-token")
    assert variables["CUDA_VISIBLE_DEVICES"] == "2,3" and variables["MMT_RESUME_STEP"] == "20"
    argv, env, on_kill = command(job, prepared, variables)
    assert argv[:3] == ["docker", "run", "--rm"] and argv[-4:] == ["ghcr.io/acme/train:1", *job.code_version.entrypoint]
    assert f"type=bind,source={work / 'checkpoint'},target=/mmt/inputs/checkpoint,readonly" in argv
    assert option_values(argv, "--gpus") == ['"device=2,3"']
    assert "run-token" not in " ".join(argv)
    assert env["MMT_API_TOKEN"] == "run-token" and env["MMT_RESUME_CHECKPOINT_DIR"] == "/mmt/inputs/checkpoint"
    assert env["MMT_RESUME_CHECKPOINT_FILE"] == "/mmt/inputs/resume-checkpoint.json"
    assert "CUDA_VISIBLE_DEVICES" not in env and "MADO_SECRET_KEY" not in env
    assert set(option_values(argv, "--env")) == {name for name in env if name.startswith("MMT_")} | {"PYTHONUNBUFFERED"}
    assert callable(on_kill)
