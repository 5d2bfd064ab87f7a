"""The Kubernetes init container's command, run here against a live server: a good checkpoint is verified and
extracted read-only, a tampered one is refused with a non-zero exit naming it and nothing is left
(docs/design/worker.md)."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.services import run_resume_from_checkpoint
from tests.worker.helpers import FILES, make_tar, stored_checkpoint
from worker.kubernetes import INPUTS_DIR, ManifestOptions, build_manifest

MADO = str(Path(sys.executable).with_name("mado"))


def init_container_run(job, inputs: Path) -> subprocess.CompletedProcess:
    """Run the manifest's init container command as the pod would: its env (the token read from the Secret),
    ``/mmt/inputs`` being ``inputs``."""
    secret, jobset = build_manifest(job, ManifestOptions(image="train:1", nnodes=2, nproc_per_node=1))
    (init,) = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["initContainers"]
    env = {"PATH": os.environ["PATH"], "HOME": str(inputs.parent)}
    for item in init["env"]:
        reference = item.get("valueFrom", {}).get("secretKeyRef")
        env[item["name"]] = secret["stringData"][reference["key"]] if reference else item["value"]
    command = [MADO if part == "mado" else str(inputs) if part == INPUTS_DIR else part for part in init["command"]]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def resume_with(failed_source_job, creator, live_server, settings):
    settings.MADO_PUBLIC_URL = live_server.url

    def make(**stored):
        checkpoint = stored_checkpoint(failed_source_job.run, 20, **stored)
        return run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint), checkpoint

    return make


def test_the_init_container_restores_a_good_checkpoint_read_only(resume_with, tmp_path):
    job, checkpoint = resume_with()
    inputs = tmp_path / "inputs"
    done = init_container_run(job, inputs)
    assert done.returncode == 0, done.stderr
    restored = inputs / "checkpoint"
    assert {p.relative_to(restored).as_posix(): p.read_bytes() for p in restored.rglob("*") if p.is_file()} == FILES
    assert stat.S_IMODE((restored / "model.pt").stat().st_mode) == 0o444
    assert f"MMT_RESUME_CHECKPOINT_DIR={restored}" in done.stdout and "MMT_RESUME_STEP=20" in done.stdout
    assert (inputs / "resume-checkpoint.json").exists()
    again = init_container_run(job, inputs)  # a restarted pod runs its init containers again
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize(
    "tampered",
    [
        make_tar({**FILES, "model.pt": b"X" + FILES["model.pt"][1:]}),
        make_tar({**FILES, "extra.bin": b"x"}),
    ],
    ids=["changed byte", "extra file"],
)
def test_the_init_container_refuses_a_tampered_checkpoint(resume_with, tmp_path, tampered):
    job, checkpoint = resume_with(stored=tampered)
    inputs = tmp_path / "inputs"
    inputs.mkdir()  # the pod's emptyDir is there before the init container starts
    done = init_container_run(job, inputs)
    assert done.returncode == 1
    # the server reads the stored tar back before sending it and names it (docs/design/checkpoints.md#damage)
    assert f"checkpoint {checkpoint.pk} is corrupt: the tar: the stored object" in done.stderr, done.stderr
    assert list(inputs.iterdir()) == [], "nothing the code could start from is left behind"
