"""The container runner: the ``docker run`` argv equivalent to the subprocess runner
(docs/design/worker.md#extract, #subprocess).

The code runs in the Queue's image with its source at ``/mmt/code`` (the
working directory), the verified checkpoint mounted read-only at
``/mmt/inputs/checkpoint`` and ``resume-checkpoint.json`` read-only at
``/mmt/inputs/resume-checkpoint.json``; ``MMT_RESUME_*`` point there.
Variables are passed by name only (``--env NAME``, the value comes from the
``docker`` client's own environment), so the Run's token never shows in a
process listing. GPUs come from ``MADO_WORKER_GPUS`` through ``--gpus``.
The ``docker`` client runs under ``worker.runner.run_process`` (its own
process group, SIGTERM forwarded into the container by ``--init``);
``docker_kill_argv`` removes a container whose client was SIGKILLed.
"""

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

CONTAINER_CODE_DIR = "/mmt/code"
CONTAINER_CHECKPOINT_DIR = "/mmt/inputs/checkpoint"
CONTAINER_RESUME_FILE = "/mmt/inputs/resume-checkpoint.json"
DOCKER_CLIENT_VARIABLES = ("DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY")
GPUS_PATTERN = re.compile(r"^(|all|none|[A-Za-z0-9][A-Za-z0-9-]*(,[A-Za-z0-9][A-Za-z0-9-]*)*)$")
_UNSAFE_MOUNT = re.compile(r'[,"\n]')


def check_gpus_setting(gpus: str) -> str:
    """``MADO_WORKER_GPUS`` stripped, or ``ValueError`` naming it: ``""`` (inherit the worker's
    ``CUDA_VISIBLE_DEVICES``), ``none``, ``all`` or a comma-separated list of GPU indexes / UUIDs."""
    value = (gpus or "").strip()
    if not GPUS_PATTERN.match(value):
        raise ValueError(f"MADO_WORKER_GPUS={gpus!r}: use '', 'none', 'all' or a list such as '0,1' or 'GPU-<uuid>'")
    return value


def cuda_visible_devices(gpus: str, worker_env: Mapping[str, str]) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for a subprocess Job: the setting's device list, ``""`` for ``none``, the
    worker's own value for ``""`` (if any), None (leave unset: every GPU) for ``all``."""
    value = check_gpus_setting(gpus)
    if value == "":
        return worker_env.get("CUDA_VISIBLE_DEVICES")
    if value == "none":
        return ""
    if value == "all":
        return None
    return value


def docker_gpus_args(gpus: str, worker_env: Mapping[str, str]) -> list[str]:
    """The ``--gpus`` option for the setting: ``all``, ``"device=0,1"`` (quoted: docker parses it as CSV) or none."""
    if check_gpus_setting(gpus) == "all":
        return ["--gpus", "all"]
    devices = cuda_visible_devices(gpus, worker_env)
    if not devices:
        return []
    return ["--gpus", f'"device={devices}"']


def container_name(job_id) -> str:
    return f"mado-job-{job_id}"


def _mount(source: Path, target: str, *, readonly: bool) -> list[str]:
    source = str(source)
    if _UNSAFE_MOUNT.search(source) or not source.startswith("/"):
        raise ValueError(f"{source!r} cannot be mounted (an absolute path without ',' or '\"' is needed)")
    spec = f"type=bind,source={source},target={target}"
    return ["--mount", spec + (",readonly" if readonly else "")]


def docker_run_argv(
    *,
    job_id,
    image: str,
    argv: list[str],
    env_names: Iterable[str],
    code_dir: Path,
    checkpoint_dir: Path | None = None,
    resume_file: Path | None = None,
    gpus: str = "",
    worker_env: Mapping[str, str] | None = None,
) -> list[str]:
    """``docker run --rm …`` running ``argv`` in ``image`` (docs/design/worker.md#extract).

    ``env_names``: the variables to pass into the container by name (their
    values must be in the ``docker`` client's environment: see
    ``container_env``). ``code_dir`` is mounted at ``/mmt/code``;
    ``checkpoint_dir`` / ``resume_file`` (resume or continue) read-only at
    ``/mmt/inputs/…``. ``gpus``: ``MADO_WORKER_GPUS``. Raises
    ``ValueError`` for an empty image or argv or an unmountable path.
    """
    if not image or not image.strip() or image.startswith("-"):
        raise ValueError(f"the queue's container image {image!r} is not usable")
    if not isinstance(argv, list) or not argv or not all(isinstance(part, str) for part in argv):
        raise ValueError("argv must be a non-empty list of strings")
    command = [
        "docker",
        "run",
        "--rm",
        "--init",
        "--name",
        container_name(job_id),
        "--security-opt",
        "no-new-privileges",
        "--stop-signal",
        "SIGTERM",
        "--workdir",
        CONTAINER_CODE_DIR,
        *_mount(code_dir, CONTAINER_CODE_DIR, readonly=False),
    ]
    if checkpoint_dir is not None:
        command += _mount(checkpoint_dir, CONTAINER_CHECKPOINT_DIR, readonly=True)
    if resume_file is not None:
        command += _mount(resume_file, CONTAINER_RESUME_FILE, readonly=True)
    for name in sorted(set(env_names)):
        command += ["--env", name]
    command += docker_gpus_args(gpus, worker_env or {})
    return [*command, image.strip(), *argv]


def container_env(env: Mapping[str, str]) -> dict[str, str]:
    """The code's variables as seen inside the container: ``MMT_RESUME_CHECKPOINT_DIR`` / ``_FILE`` point at
    the mounts; ``CUDA_VISIBLE_DEVICES`` is dropped (``--gpus`` decides, devices are renumbered inside)."""
    inside = {name: value for name, value in env.items() if name != "CUDA_VISIBLE_DEVICES"}
    if "MMT_RESUME_CHECKPOINT_DIR" in inside:
        inside["MMT_RESUME_CHECKPOINT_DIR"] = CONTAINER_CHECKPOINT_DIR
    if "MMT_RESUME_CHECKPOINT_FILE" in inside:
        inside["MMT_RESUME_CHECKPOINT_FILE"] = CONTAINER_RESUME_FILE
    return inside


def docker_kill_argv(job_id) -> list[str]:
    """``docker rm --force`` of the Job's container, for when its client had to be SIGKILLed."""
    return ["docker", "rm", "--force", container_name(job_id)]
