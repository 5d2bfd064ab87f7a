"""The dependency arrows point one way: jobs → checkpoints → sweeps → runs → mado, worker → any (ARCHITECTURE rule 7).

Every ``import`` statement of every module is read from the source (inside
functions too), so an import dodged into a function body counts. ``mado``'s
URL confs, Celery app and management commands are the roof and may import
every app; the rest of ``mado`` (policy, authentication, errors, settings
helpers) is the ground and imports none. A lower app that must reach a
higher one sends a signal the higher app connects in its ``apps.py``.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LEVEL = {"mado": 0, "runs": 1, "sweeps": 2, "checkpoints": 3, "jobs": 4, "mlflow_api": 5, "worker": 6}
ROOF = {"mado/urls.py", "mado/api_urls.py", "mado/celery.py"}


def imported_modules(source: str) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import in ``source``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def upward_imports(app: str) -> list[str]:
    """``path:line imports module`` for each import in ``app`` of an app above it (migrations and the roof aside)."""
    wrong = []
    for path in sorted((ROOT / app).rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if "/migrations/" in relative or relative in ROOF or relative.startswith("mado/management/"):
            continue
        for line, module in imported_modules(path.read_text()):
            target = module.split(".")[0]
            if LEVEL.get(target, -1) > LEVEL[app]:
                wrong.append(f"{relative}:{line} imports {module}")
    return wrong


@pytest.mark.parametrize("app", ["mado", "runs", "sweeps", "checkpoints", "jobs"])
def test_no_app_imports_one_above_it(app):
    assert upward_imports(app) == []


def test_the_check_sees_an_import_hidden_in_a_function():
    source = "def f():\n    from jobs.models import RunToken\n    import checkpoints.models\n"
    assert imported_modules(source) == [(2, "jobs.models"), (3, "checkpoints.models")]


@pytest.mark.parametrize("module", ["mado.policy", "mado.authentication"])
def test_policy_and_authentication_load_no_app(module):
    """``python -c "import mado.policy"`` (settings named, no app loaded) pulls in no module of runs, sweeps,
    checkpoints, jobs or worker."""
    probe = (
        f"import sys, {module}; apps = ('runs', 'sweeps', 'checkpoints', 'jobs', 'worker');"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in apps))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "mado.settings"}
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
