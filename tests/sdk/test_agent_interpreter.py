"""``mado agent`` refuses to start when the sweep program's Python cannot import the SDK, before claiming a trial
(docs/design/sweeps.md#sweeps): started from a shell without the project's .venv, ``python`` is the system one and every
trial would fail at its first import."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mado_tracking.cli.interpreter import SDK_IMPORTS, InterpreterUnfit, check_interpreter, program_interpreter
from tests.sdk.sweep_stub import TOKEN, SweepStub

MADO = str(Path(sys.executable).parent / "mado")
SDK_PYPROJECT = Path(__file__).resolve().parents[2] / "sdk" / "pyproject.toml"


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def bare_python(directory: Path) -> Path:
    """A ``python3`` on its own ``PATH`` entry that, like a system Python without the SDK, cannot import it."""
    return executable(
        directory / "python3", "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'mado_tracking'\" >&2\nexit 1\n"
    )


def agent_environment(api, path: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("MMT_")},
        "MMT_API_URL": api.url,
        "MMT_API_TOKEN": TOKEN,
        "PATH": path,
    }


CLAIM = {
    "trial": {
        "number": 1,
        "parameters": {"lr": 0.1},
        "run_id": 101,
        "external_id": "trial-1",
        "requeue_count": 0,
        "lease_expires_at": None,
        "latest_checkpoint": None,
    },
    "done": False,
}


def test_an_agent_whose_python_lacks_the_sdk_stops_before_claiming_naming_the_interpreter_and_the_fix(tmp_path):
    python = bare_python(tmp_path / "bin")
    with SweepStub(program=["python3", "train.py"], claims=[CLAIM]) as api:
        agent = subprocess.run(
            [MADO, "agent", "7"],
            env=agent_environment(api, f"{python.parent}:/usr/bin:/bin"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        claimed, reports = list(api.agents), list(api.reports)
    assert agent.returncode == 1, agent.stderr
    assert f"the sweep's program runs {python} ('python3' on PATH), which cannot import the mado SDK" in agent.stderr
    assert "No module named 'mado_tracking'" in agent.stderr
    assert "source .venv/bin/activate" in agent.stderr and f"{python} -m pip install -e ./sdk" in agent.stderr
    assert "No trial was claimed." in agent.stderr
    assert claimed == [] and reports == []  # the trial is still there for an agent that can run it


def test_an_agent_whose_python_is_not_on_path_stops_before_claiming(tmp_path):
    with SweepStub(program=["python3.99", "train.py"], claims=[CLAIM]) as api:
        agent = subprocess.run(
            [MADO, "agent", "7"], env=agent_environment(api, str(tmp_path)), capture_output=True, text=True, timeout=60
        )
        claimed = list(api.agents)
    assert agent.returncode == 1
    assert "runs 'python3.99', which is not found on PATH" in agent.stderr
    assert claimed == []


def test_the_interpreter_of_a_script_is_read_from_its_shebang_line(tmp_path):
    python = bare_python(tmp_path / "bin")
    script = executable(tmp_path / "train", f"#!/usr/bin/env {python.name} -u\nprint('hi')\n")
    path = f"{python.parent}:/usr/bin:/bin"
    assert program_interpreter([str(script), "--lr=1"], path=path) == "python3"
    with pytest.raises(InterpreterUnfit, match="cannot import the mado SDK"):
        check_interpreter([str(script)], env={"PATH": path})


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["python", "train.py"], "python"),
        (["/opt/venv/bin/python3.12", "-m", "train"], "/opt/venv/bin/python3.12"),
        (["env", "OMP_NUM_THREADS=1", "python3", "train.py"], "python3"),
        (["bash", "train.sh"], None),
        (["./no-such-program"], None),
        ([], None),
    ],
)
def test_the_program_interpreter_is_its_python_word_or_none(argv, expected):
    assert program_interpreter(argv, path="/usr/bin:/bin") == expected


def test_a_program_whose_python_has_the_sdk_passes_and_a_binary_is_not_checked(tmp_path):
    assert check_interpreter([sys.executable, "train.py"], env=dict(os.environ)) == os.path.realpath(sys.executable)
    binary = executable(tmp_path / "trainer", "\x7fELF not a script")
    assert check_interpreter([str(binary)], env={"PATH": str(tmp_path)}) is None


def test_the_checked_imports_cover_every_runtime_dependency_of_the_sdk():
    import tomllib

    names = {"PyYAML": "yaml"}
    dependencies = tomllib.loads(SDK_PYPROJECT.read_text())["project"]["dependencies"]
    wanted = {
        names.get(spec.split(">")[0].split("=")[0].strip(), spec.split(">")[0].strip().lower()) for spec in dependencies
    }
    assert wanted <= set(SDK_IMPORTS), wanted - set(SDK_IMPORTS)
