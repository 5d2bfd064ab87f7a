"""The dependency arrows point one way (docs/design/house.md#arrows): mlflow_api → alerts → jobs → parity →
checkpoints → sweeps → runs → mado, worker → any app, and ``config`` (settings, URL confs, the Celery app,
management commands), the roof, above them all.

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
LEVEL = {
    "mado": 0,
    "runs": 1,
    "sweeps": 2,
    "checkpoints": 3,
    "parity": 3.5,
    "jobs": 4,
    "alerts": 4.5,
    "mlflow_api": 5,
    "worker": 6,
    "config": 7,
}


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


@pytest.mark.parametrize(
    "app", ["mado", "runs", "sweeps", "checkpoints", "parity", "jobs", "alerts", "mlflow_api", "worker"]
)
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
        f"import sys, {module}; apps = ('runs', 'sweeps', 'checkpoints', 'parity', 'jobs', 'worker');"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in apps))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# --- The SDK: a pure HTTP client, whose modules import each other one way ----------------------------------------
# ``mado_tracking`` is installed in training environments without the server: no module of it imports Django,
# DRF or a server app, and no two of its modules import each other (through any chain), module level or not.

SDK = ROOT / "sdk" / "mado_tracking"
SERVER_PACKAGES = {
    "django",
    "rest_framework",
    "mado",
    "runs",
    "checkpoints",
    "parity",
    "jobs",
    "worker",
    "mlflow_api",
    "sweeps",
    "alerts",
}


def sdk_modules() -> dict[str, Path]:
    """Dotted name → file of every module of ``mado_tracking`` (a package by its ``__init__.py``)."""
    modules = {}
    for path in sorted(SDK.rglob("*.py")):
        parts = path.relative_to(SDK.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def module_imports(source: str, module: str, is_package: bool, known: set[str]) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``source`` (of ``module``), at any depth, as modules of ``known``.

    Relative imports are resolved against ``module``; ``from package import name`` is ``package.name`` when
    that is a module of ``known``, else ``package``. Imports of modules outside ``known`` are left out.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name in known]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module
            for alias in node.names:
                if f"{origin}.{alias.name}" in known:
                    found.append((node.lineno, f"{origin}.{alias.name}"))
                elif origin in known:
                    found.append((node.lineno, origin))
    return found


def sdk_import_graph() -> dict[str, dict[str, str]]:
    """``{module: {imported module: "path:line"}}`` over ``mado_tracking``'s modules (the first line per pair)."""
    modules = sdk_modules()
    graph = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        relative = path.relative_to(ROOT).as_posix()
        for line, target in module_imports(path.read_text(), module, path.name == "__init__.py", set(modules)):
            if target != module:
                edges.setdefault(target, f"{relative}:{line}")
    return graph


def import_cycles(graph: dict[str, dict[str, str]], limit: int = 50) -> list[str]:
    """Each elementary cycle of ``graph`` (at most ``limit``) as ``a -> b (where a imports b) -> ... -> a``."""
    cycles = []

    def walk(start: str, path: list[str]) -> None:
        for target in sorted(graph.get(path[-1], {})):
            if len(cycles) >= limit:
                return
            if target == start:
                steps = "".join(f" -> {b} ({graph[a][b]})" for a, b in zip(path, path[1:] + [start]))
                cycles.append(f"{start}{steps}")
            elif target > start and target not in path:  # each cycle once: from its smallest module
                walk(start, path + [target])

    for module in sorted(graph):
        walk(module, [module])
    return cycles


def test_no_sdk_module_imports_the_server():
    """No ``import`` (at any depth) of a ``mado_tracking`` module names Django, DRF or a server app."""
    wrong = []
    for path in sorted(SDK.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for line, module in imported_modules(path.read_text()):
            if module.split(".")[0] in SERVER_PACKAGES:
                wrong.append(f"{relative}:{line} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_sdk_modules_import_each_other_without_a_cycle():
    graph = sdk_import_graph()
    assert "mado_tracking.run" in graph and "mado_tracking.cli.jobs" in graph  # the walk found the modules
    cycles = import_cycles(graph)
    assert not cycles, "import cycles (a -> b (where a imports b)):\n" + "\n".join(cycles)


def test_the_sdk_graph_resolves_from_package_import_module():
    source = "from mado_tracking import config as c, __version__\nfrom . import metrics\ndef f():\n    import x\n"
    known = {"mado_tracking", "mado_tracking.config", "mado_tracking.metrics"}
    assert module_imports(source, "mado_tracking.unsent", False, known) == [
        (1, "mado_tracking.config"),
        (1, "mado_tracking"),
        (2, "mado_tracking.metrics"),
    ]


def test_the_cycle_check_names_each_cycle_and_its_lines():
    graph = {"a": {"b": "a.py:1"}, "b": {"a": "b.py:7", "c": "b.py:8"}, "c": {"b": "c.py:2"}, "d": {"a": "d.py:1"}}
    assert import_cycles(graph) == ["a -> b (a.py:1) -> a (b.py:7)", "b -> c (b.py:8) -> b (c.py:2)"]


def test_importing_the_sdk_loads_no_django_module():
    """``python -c "import mado_tracking"`` loads no module of Django, DRF or a server app; each import of one
    is reported with the SDK line that made it."""
    probe = (
        "import sys, traceback\n"
        f"banned = {sorted(SERVER_PACKAGES)!r}\n"
        "class Spy:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in banned:\n"
        "            importer = [f for f in traceback.extract_stack()[:-1] if not f.filename.startswith('<')][-1]\n"
        "            if '/mado_tracking/' in importer.filename:\n"
        "                print(f'{importer.filename}:{importer.lineno} imports {name}')\n"
        "sys.meta_path.insert(0, Spy())\n"
        "import mado_tracking\n"
        "for name in sorted({m.split('.')[0] for m in sys.modules} & set(banned)):\n"
        "    print(f'{name} is loaded')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "sdk"), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=SDK.parent, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert not result.stdout.strip(), result.stdout


SERVER_APPS = ("config", "mado", "runs", "sweeps", "checkpoints", "parity", "jobs", "alerts", "mlflow_api", "worker")


def server_lines(app: str) -> int:
    """Lines of ``app``'s Python files, migrations aside (generated history, not a room one reads)."""
    files = (p for p in (ROOT / app).rglob("*.py") if "migrations" not in p.relative_to(ROOT).parts)
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in files)


def test_runs_stays_a_room_one_can_see_whole():
    """runs/ keeps the Run core only: under 30 % of the server's lines (docs/design/house.md#layout); a new
    protocol, storage layer or feature of its own goes into its own app."""
    lines = {app: server_lines(app) for app in SERVER_APPS}
    share = lines["runs"] / sum(lines.values())
    assert share < 0.30, f"runs/ holds {share:.1%} of the server's lines: {lines}"
