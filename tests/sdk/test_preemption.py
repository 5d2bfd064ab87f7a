"""run.mark_preempting() and how a preempting run ends (docs/design/sweeps.md#sweeps), online in subprocesses and
offline."""

import json
import os
import signal
import subprocess
import sys

import pytest

import mado_tracking
from runs.models import Run, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)

HEADER = "import signal, sys, mado_tracking\n"


def _run_script(body: str, env: dict, cwd, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", HEADER + body],
        env={**os.environ, **env},
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("ending", "status"),
    [
        ("sys.exit(1)", RunStatus.PREEMPTED),
        ("sys.exit(0)", RunStatus.FINISHED),
        ("pass", RunStatus.FINISHED),
        ("raise KeyboardInterrupt", RunStatus.PREEMPTED),
        ("raise RuntimeError('x')", RunStatus.PREEMPTED),
    ],
)
def test_leaving_the_block_after_mark_preempting(mmt_env, tmp_path, ending, status):
    script = (
        "with mado_tracking.start_run(id='pre-1') as run:\n"
        "    run.mark_preempting()\n"
        "    run.mark_preempting()\n"  # idempotent
        "    print(run.status, flush=True)\n"
        f"    {ending}\n"
    )
    done = _run_script(script, mmt_env, tmp_path)
    assert done.stdout.strip() == "preempting", done.stderr
    assert Run.objects.get(external_id="pre-1").status == status, done.stderr


def test_a_sigterm_handler_marks_preempting_and_the_nonzero_exit_ends_preempted(mmt_env, tmp_path):
    script = (
        "run = mado_tracking.start_run(id='pre-2')\n"
        "def on_term(signum, frame):\n"
        "    run.mark_preempting()\n"
        "    print('preempting', flush=True)\n"
        "    sys.stdin.readline()\n"  # the test looks at the server meanwhile
        "    sys.exit(1)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    run.log_metrics({'loss': 1.0})\n"
        "    signal.pause()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", HEADER + script],
        env={**os.environ, **mmt_env},
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGTERM)
        assert child.stdout.readline().strip() == "preempting"
        assert Run.objects.get(external_id="pre-2").status == RunStatus.PREEMPTING
        _, err = child.communicate("\n", timeout=60)
    finally:
        child.kill()
    assert child.returncode == 1
    assert Run.objects.get(external_id="pre-2").status == RunStatus.PREEMPTED, err


@pytest.mark.parametrize(
    ("ending", "status"),
    [("", RunStatus.PREEMPTED), ("sys.exit(1)", RunStatus.PREEMPTED), ("sys.exit(0)", RunStatus.FINISHED)],
)
def test_a_preempting_run_left_open_ends_by_its_exit_code(mmt_env, tmp_path, ending, status):
    done = _run_script(
        f"run = mado_tracking.start_run(id='pre-3')\nrun.mark_preempting()\n{ending}\n", mmt_env, tmp_path
    )
    assert Run.objects.get(external_id="pre-3").status == status, done.stderr
    # resume="auto" picks an unfinished run up again
    assert (tmp_path / ".mado" / "resume.json").exists() is (status != RunStatus.FINISHED)


def test_a_failing_script_without_with_leaves_its_run_to_resume_auto(mmt_env, tmp_path):
    script = "run = mado_tracking.start_run(resume='auto')\nprint(run.external_id, flush=True)\nsys.exit(1)\n"
    first = _run_script(script, mmt_env, tmp_path)
    again = _run_script(script, mmt_env, tmp_path)
    assert first.stdout == again.stdout and first.stdout.strip(), first.stderr + again.stderr
    assert Run.objects.get(external_id=first.stdout.strip()).status == RunStatus.FAILED


def test_finish_accepts_preempted(mmt_env):
    run = mado_tracking.start_run()
    run.finish("preempted")
    assert Run.objects.get(pk=run.id).status == RunStatus.PREEMPTED


@pytest.mark.parametrize(("ending", "status"), [("pass", "finished"), ("raise SystemExit(1)", "preempted")])
def test_offline_mark_preempting_is_recorded_and_ends_the_same_way(tmp_path, ending, status):
    script = (
        "with mado_tracking.start_run(offline=True, output='off') as run:\n"
        "    run.mark_preempting()\n"
        "    run.mark_preempting()\n"
        "    print(json.load(open('off/run.json'))['status'], flush=True)\n"
        f"    {ending}\n"
    )
    done = _run_script("import json\n" + script, {}, tmp_path)
    assert done.stdout.strip() == "preempting", done.stderr
    record = json.loads((tmp_path / "off" / "run.json").read_text())
    assert (record["status"], record["attempts"][-1]["status"]) == (status, status)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads thread signal masks from Linux's /proc")
def test_only_the_main_thread_can_receive_the_signals_a_program_handles(mmt_env, tmp_path):
    """A SIGTERM given to the SDK's sender thread would leave a main thread waiting in signal.pause() asleep."""
    script = (
        "import os, threading\n"
        "run = mado_tracking.start_run()\n"
        "main = threading.main_thread().native_id\n"
        "for tid in os.listdir('/proc/self/task'):\n"
        "    status = open(f'/proc/self/task/{tid}/status').read()\n"
        "    blocked = int(status.split('SigBlk:')[1].split()[0], 16)\n"
        "    handled = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)\n"
        "    print(int(tid) == main, all(blocked >> (s - 1) & 1 for s in handled))\n"
        "run.finish()\n"
    )
    done = _run_script(script, mmt_env, tmp_path)
    # the main thread receives them; every SDK thread (metric sender, system metrics) blocks them
    assert set(done.stdout.split("\n")[:-1]) == {"True False", "False True"}, (done.stdout, done.stderr)
