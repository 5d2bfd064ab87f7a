"""Training programs as child processes, started the way a Job's worker starts them: with a checkpoint to resume
from (``job_resume_variables``), or stopped by a signal once they are training (``signal_once_ready``;
docs/design/resume.md#in-the-code, docs/design/runs.md#preemption)."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

EXAMPLE_TIMEOUT_S = 300


_PROCESS_GROUP_VARIABLES = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT"}
)


def _session_only(name: str) -> bool:
    """A variable of this test session that must not reach an example: ours, or a process group's."""
    return name in _PROCESS_GROUP_VARIABLES or name.startswith(("MMT_", "ACCELERATE_", "PL_", "TORCHELASTIC_"))


def run_example(
    script: Path, *args: str, env: dict | None = None, cwd=None, launcher: tuple[str, ...] = (sys.executable,)
) -> subprocess.CompletedProcess:
    """``launcher script args`` to its end (300 s at most), output captured as text; its environment is this one
    without the ``MMT_*`` variables of the test session and without what in-process framework tests may have left
    there for a process group (``RANK``, ``MASTER_PORT``, ``ACCELERATE_*``, ``PL_*`` …), plus ``env``."""
    environment = {key: value for key, value in os.environ.items() if not _session_only(key)}
    return subprocess.run(
        [*launcher, str(script), *args],
        env={**environment, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT_S,
    )


def job_resume_variables(directory: Path, step: int, info: Path, *, checkpoint_id=7, source_run_id=3) -> dict[str, str]:
    """The ``MMT_RESUME_*`` variables a Job's worker sets for the checkpoint extracted into ``directory`` at
    ``step``; writes the ``resume-checkpoint.json`` they name to ``info``."""
    info.write_text(json.dumps({"checkpointId": checkpoint_id, "sourceRunId": source_run_id, "step": step}))
    return {
        "MMT_RESUME_CHECKPOINT_DIR": str(directory),
        "MMT_RESUME_STEP": str(step),
        "MMT_RESUME_CHECKPOINT_FILE": str(info),
    }


def set_job_resume_variables(monkeypatch, directory: Path, step: int, info: Path, **ids) -> None:
    """``job_resume_variables`` set in this process's environment for the test (``monkeypatch``)."""
    for name, value in job_resume_variables(directory, step, info, **ids).items():
        monkeypatch.setenv(name, value)


def signal_once_ready(
    argv: list[str],
    *,
    env: dict,
    cwd: Path,
    ready: str,
    timeout: float = 120,
    new_session: bool = False,
    send: Callable[[subprocess.Popen], None] | None = None,
) -> subprocess.CompletedProcess:
    """Start ``argv`` (this environment plus ``env``); once it printed a line starting with ``ready``, SIGTERM it
    (or ``send(child)``: to its process group, one of its children) and return it ended, within ``timeout`` s.

    ``stdout`` of the answer is what it printed after the ``ready`` line, ``stderr`` all it wrote there (into a
    file, so a chatty program never blocks on a full pipe). ``new_session``: the child leads a process group of
    its own, as a Job's runner starts it. Fails the test when the program ends without printing ``ready``, or has
    not printed it within ``timeout`` s (it is killed then).
    """
    with tempfile.TemporaryFile(mode="w+") as errors:
        child = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            start_new_session=new_session,
        )
        late = threading.Timer(timeout, child.kill)  # a program that never gets ready fails the test, not CI
        late.start()
        try:
            for line in child.stdout:
                if line.startswith(ready):
                    late.cancel()
                    break
            else:
                child.wait(timeout=timeout)
                errors.seek(0)
                raise AssertionError(f"{' '.join(argv)} ended before printing {ready!r}:\n{errors.read()[-3000:]}")
            if send is None:
                child.send_signal(signal.SIGTERM)
            else:
                send(child)
            out, _ = child.communicate(timeout=timeout)
        finally:
            late.cancel()
            child.kill()
        errors.seek(0)
        return subprocess.CompletedProcess(argv, child.returncode, out, errors.read())
