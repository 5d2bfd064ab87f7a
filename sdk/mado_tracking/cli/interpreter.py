"""Before ``mado agent`` claims a trial: can the sweep's program import the SDK? (docs/design/sweeps.md#sweeps.)

A sweep's program is usually ``python train.py``; ``python`` is whatever the
agent's ``PATH`` finds first. Started from a shell where the project's
``.venv`` is not active, that is the system Python, which has neither
``mado_tracking`` nor its dependencies: every trial would fail at its first
import and burn its parameter set. So the agent asks the program's
interpreter once, before claiming anything, to import the SDK and its
dependencies, and refuses to start with a message naming the interpreter and
the fix.

The interpreter is the program's first word when it names a Python
(``python``, ``python3.12``, ``/opt/venv/bin/python``; also after ``env``),
or the ``#!`` line of a script started directly. A program that is not a
Python one (a shell script, a binary) is not checked.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

# Import names of mado_tracking and of its runtime dependencies (sdk/pyproject.toml ``dependencies``).
SDK_IMPORTS = ("mado_tracking", "requests", "urllib3", "click", "tqdm", "yaml", "psutil", "orjson")
PYTHON_NAME = re.compile(r"^(python|pypy)[0-9.]*$")
CHECK_TIMEOUT_S = 60


class InterpreterUnfit(Exception):
    """The program's interpreter cannot be found or cannot import the SDK; the message says what to do."""


def program_interpreter(argv: list[str], *, path: str | None) -> str | None:
    """The Python interpreter that ``argv`` (the sweep's program) starts, as given (``python``, a path), or
    None when the program is not a Python one. ``path``: the ``PATH`` the program is started with."""
    if not argv:
        return None
    words = list(argv)
    if Path(words[0]).name == "env":
        words = [word for word in words[1:] if "=" not in word and not word.startswith("-")]
    if words and PYTHON_NAME.match(Path(words[0]).name):
        return words[0]
    script = shutil.which(words[0], path=path) if words else None
    if script is None:
        return None
    try:
        with open(script, "rb") as handle:
            first = handle.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    shebang = first[2:].decode("utf-8", "replace").split()
    return program_interpreter(shebang, path=path) if shebang else None


def check_interpreter(argv: list[str], *, env: dict[str, str]) -> str | None:
    """Raise ``InterpreterUnfit`` unless the interpreter of ``argv`` runs ``import mado_tracking`` and the SDK's
    dependencies under ``env`` (the environment trials get); returns the interpreter's resolved path (None:
    not a Python program, nothing checked). Runs the interpreter once, at most ``CHECK_TIMEOUT_S`` seconds."""
    interpreter = program_interpreter(argv, path=env.get("PATH"))
    if interpreter is None:
        return None
    resolved = shutil.which(interpreter, path=env.get("PATH"))
    fix = (
        "Start the agent from a shell where the project's virtual environment is active "
        "(source .venv/bin/activate), or install the SDK into that interpreter "
        f"({resolved or interpreter} -m pip install -e ./sdk)."
    )
    if resolved is None:
        raise InterpreterUnfit(f"the sweep's program runs {interpreter!r}, which is not found on PATH. {fix}")
    code = "import " + ", ".join(SDK_IMPORTS)
    try:
        done = subprocess.run(
            [resolved, "-c", code], env=env, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise InterpreterUnfit(
            f"the sweep's program runs {resolved}, which could not be started ({error}). {fix}"
        ) from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        why = lines[-1] if lines else f"exit status {done.returncode}"
        raise InterpreterUnfit(
            f"the sweep's program runs {resolved} ({interpreter!r} on PATH), which cannot import "
            f"the mado SDK: {why}. {fix}"
        )
    return os.path.realpath(resolved)
