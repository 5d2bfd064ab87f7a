"""Every production role of the image's entry point refuses to start without ``MADO_SECRET_KEY`` and names it;
the demo starts without one (docs/deploy.md#secret-key). The entry point runs here, as in the image, on this
checkout's virtual environment: each role's process (gunicorn, Celery, manage.py) loads the settings and stops."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "deploy" / "entrypoint.sh"
ROLES = {
    "web": ["web"],  # gunicorn's worker loads the settings and stops, then its master exits
    "worker": ["worker", "--queues", "cpu"],
    "maintenance worker": ["worker", "--queues", "maintenance"],
    "beat": ["beat"],
    "migrate": ["migrate"],
}


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The image's environment less any secret: this checkout's interpreter and commands first on PATH."""
    return {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "HOME": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "MADO_DATA_DIR": str(tmp_path / "data"),
        "MADO_BIND": "127.0.0.1:0",
        "MADO_WEB_WORKERS": "1",
        **extra,
    }


def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        ["sh", str(ENTRYPOINT), *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_each_production_role_refuses_to_start_without_the_secret_key_and_names_it(tmp_path):
    # started together: each pays a Python start, none waits for another's
    started = {
        role: start(argv, environment(tmp_path, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / role.replace(" ", "-"))))
        for role, argv in ROLES.items()
    }
    for role, process in started.items():
        output, _ = process.communicate(timeout=120)
        assert process.returncode != 0, (role, output[-3000:])
        assert f"{role.split()[-1]} refuses to start: MADO_SECRET_KEY is not set" in output, (role, output[-3000:])


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["demo", "--help"], {}),  # the image's demo makes its own key for its processes
        (["migrate", "--help"], {"MADO_SECRET_KEY": "a-key-of-this-deployment"}),
        (["migrate", "--help"], {"MADO_DEBUG": "1"}),  # a development setup
    ],
    ids=["demo-without-key", "migrate-with-key", "migrate-debug"],
)
def test_the_demo_a_role_with_its_key_and_a_development_setup_start(tmp_path, argv, extra):
    process = start(argv, environment(tmp_path, **extra))
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output[-3000:]
    assert "refuses to start" not in output
