"""What a start shows on stderr (docs/design/runs.md#resume-modes): one line naming the Run, started or resumed
and where to see it, and the SDK's INFO lines when the program set up no logging; ``MMT_LOG_LEVEL`` sets their
level; a program with its own logging sees each line once; rank > 0 says nothing."""

import os
import subprocess
import sys

import pytest

import mado_tracking
from runs.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

PROGRAM = """
import logging, sys, mado_tracking
if sys.argv[1] != "none":
    logging.basicConfig(level=getattr(logging, sys.argv[1]), format="LOG %(message)s")
with mado_tracking.start_run(id="seen-1", resume="allow") as run:
    run.log_metrics({"loss": 1.0})
"""


def _start(mmt_env, logging_set_up="none", **env) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, logging_set_up],
        env={**os.environ, **mmt_env, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_program_without_logging_set_up_sees_its_run_and_the_sdks_info_lines(mmt_env):
    first = _start(mmt_env)
    run = Run.objects.get(external_id="seen-1")
    url = f"{mmt_env['MMT_API_URL']}/runs/{run.pk}/"
    assert first.splitlines() == [f"mado: run seen-1 (started): {url}"]
    again = _start(mmt_env)
    assert again.splitlines() == [
        f"mado: run seen-1 (resumed at step 1): {url}",
        "mado: resumed run seen-1 at step 1; it has no complete checkpoint",
    ]


def test_mmt_log_level_warning_silences_the_start_line_and_the_info_lines(mmt_env):
    _start(mmt_env)
    assert _start(mmt_env, MMT_LOG_LEVEL="warning") == ""


@pytest.mark.parametrize(("level", "shown"), [("INFO", True), ("WARNING", False)])
def test_a_program_with_its_own_logging_gets_each_line_once_through_its_handlers(mmt_env, level, shown):
    _start(mmt_env)
    lines = _start(mmt_env, level).splitlines()
    assert lines[0].startswith("mado: run seen-1 (resumed at step 1): ")
    info = "mado: resumed run seen-1 at step 1; it has no complete checkpoint"
    assert lines[1:] == ([f"LOG {info}"] if shown else [])


def test_offline_the_line_names_the_directory_and_other_ranks_say_nothing(monkeypatch, tmp_path, capsys):
    with mado_tracking.start_run(offline=True, output=tmp_path / "off", id="off-1"):
        pass
    assert capsys.readouterr().err == f"mado: run off-1 (started): {(tmp_path / 'off').resolve()}\n"
    for name, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    with mado_tracking.start_run(offline=True, output=tmp_path / "rank1", id="off-2"):
        pass
    assert "mado: run" not in capsys.readouterr().err
