"""The dependency arrows point one way (docs/design/house.md#arrows): mlflow_api → jobs → checkpoints → sweeps →
runs → mado, worker → any app, and ``config`` (settings, URL confs, the Celery app, management commands), the roof,
above them all.

Every ``import`` statement of every module is read from the source (inside
functions too), so an import dodged into a function body counts. ``mado``
(policy, authentication, errors, API and settings helpers, the outbox) is
the ground and imports no app. A lower app that must start work in a higher
one sends an event (``runs.hooks``) the higher app connects in its ``apps.py``;
what it must know is written onto its rows by the app that knows.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LEVEL = {"mado": 0, "runs": 1, "sweeps": 2, "checkpoints": 3, "jobs": 4, "mlflow_api": 5, "worker": 6, "config": 7}


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
    """``path:line imports module`` for each import in ``app`` of an app above it (migrations aside: a model's
    foreign key may name a higher app's model, as ``Run.source_checkpoint`` does)."""
    wrong = []
    for path in sorted((ROOT / app).rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if "/migrations/" in relative:
            continue
        for line, module in imported_modules(path.read_text()):
            target = module.split(".")[0]
            if LEVEL.get(target, -1) > LEVEL[app]:
                wrong.append(f"{relative}:{line} imports {module}")
    return wrong


@pytest.mark.parametrize("app", ["mado", "runs", "checkpoints", "jobs", "mlflow_api", "worker"])
def test_no_app_imports_one_above_it(app):
    assert upward_imports(app) == []


def test_the_check_sees_an_import_hidden_in_a_function():
    source = "def f():\n    from jobs.models import RunToken\n    import checkpoints.models\n"
    assert imported_modules(source) == [(2, "jobs.models"), (3, "checkpoints.models")]


@pytest.mark.parametrize("module", ["mado.policy", "mado.authentication"])
def test_policy_and_authentication_load_no_app(module):
    """``python -c "import mado.policy"`` (settings named, no app loaded) pulls in no module of runs, checkpoints,
    jobs or worker."""
    probe = (
        f"import sys, {module}; apps = ('runs', 'checkpoints', 'jobs', 'worker');"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in apps))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
