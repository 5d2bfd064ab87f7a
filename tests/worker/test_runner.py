"""The runner starts the code as an argv in its own process group with an allowlisted environment,
streams and caps its log, and stops it with SIGTERM then SIGKILL (docs/design/worker.md#subprocess)."""

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from worker.runner import TRUNCATED_LINE, child_env, run_process

PY = sys.executable


def script(tmp_path: Path, body: str, name: str = "prog.py") -> list[str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return [PY, str(path)]


def run(argv, tmp_path, **kwargs):
    chunks: list[str] = []
    kwargs.setdefault("env", child_env({}))
    kwargs.setdefault("grace_s", 5)
    kwargs.setdefault("poll_s", 0.1)
    outcome = run_process(argv, cwd=tmp_path, on_output=chunks.append, **kwargs)
    return outcome, "".join(chunks), chunks


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_it_returns_the_exit_code_and_merges_stdout_and_stderr(tmp_path):
    outcome, log, _ = run(
        script(
            tmp_path,
            """
        import sys
        print("to stdout")
        print("to stderr", file=sys.stderr)
        sys.exit(3)
    """,
        ),
        tmp_path,
    )
    assert outcome == (3, False, None, False)
    assert "to stdout\n" in log and "to stderr\n" in log


def test_it_runs_in_the_given_directory_without_a_shell(tmp_path):
    work = tmp_path / "code"
    work.mkdir()
    argv = script(
        tmp_path,
        """
        import json, os, sys
        print(json.dumps({"cwd": os.getcwd(), "argv": sys.argv[1:]}))
    """,
    ) + ["; touch hacked", "$(id)"]
    outcome, log, _ = run(argv, work)
    assert outcome.exit_code == 0
    seen = json.loads(log)
    assert seen == {"cwd": str(work), "argv": ["; touch hacked", "$(id)"]}
    assert not (work / "hacked").exists()


def test_the_log_streams_while_the_code_runs(tmp_path):
    """The code waits for a file that only the log callback creates, once it saw the code's first line."""
    flag = tmp_path / "seen"
    argv = script(
        tmp_path,
        f"""
        import os, time
        print("first line")
        deadline = time.time() + 20
        while not os.path.exists({str(flag)!r}) and time.time() < deadline:
            time.sleep(0.05)
        print("streamed" if os.path.exists({str(flag)!r}) else "not streamed")
    """,
    )

    def on_output(text):
        chunks.append(text)
        if "first line" in text:
            flag.touch()

    chunks: list[str] = []
    outcome = run_process(argv, cwd=tmp_path, env=child_env({}), on_output=on_output, poll_s=0.1)
    assert outcome.exit_code == 0
    assert "".join(chunks) == "first line\nstreamed\n"
    assert len(chunks) == 2  # whole lines, delivered as they came


def test_the_log_is_capped_and_the_code_still_finishes(tmp_path):
    outcome, log, chunks = run(
        script(
            tmp_path,
            """
        import sys
        for i in range(20000):
            print(f"line {i:05d} " + "x" * 90)
        print("last", file=sys.stderr)
    """,
        ),
        tmp_path,
        log_max_bytes=5000,
    )
    assert outcome.exit_code == 0
    assert log.endswith(TRUNCATED_LINE)
    assert len(log.encode()) <= 5000 + len(TRUNCATED_LINE) + 1
    assert log.startswith("line 00000 ") and "last" not in log
    assert log.count(TRUNCATED_LINE) == 1


def test_a_partial_last_line_and_bad_utf8_are_still_delivered(tmp_path):
    outcome, log, _ = run(
        script(
            tmp_path,
            r"""
        import sys
        sys.stdout.buffer.write("日本".encode() + b"\xff no newline")
    """,
        ),
        tmp_path,
    )
    assert outcome.exit_code == 0
    assert log == "日本\ufffd no newline"


def test_only_allowlisted_variables_reach_the_code(tmp_path, monkeypatch):
    monkeypatch.setenv("MADO_SECRET_KEY", "server-secret")
    monkeypatch.setenv("MADO_DATABASE_URL", "postgresql://user:pw@db/mado")
    monkeypatch.setenv("MADO_S3_SECRET_ACCESS_KEY", "s3-secret")
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://secret@redis")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv("LANG", "C.UTF-8")
    env = child_env({"MMT_RUN_ID": "abc", "MMT_API_TOKEN": "run-token", "CUDA_VISIBLE_DEVICES": "1"})
    outcome, log, _ = run(
        script(
            tmp_path,
            """
        import json, os
        print(json.dumps(dict(os.environ)))
    """,
        ),
        tmp_path,
        env=env,
    )
    assert outcome.exit_code == 0
    seen = json.loads(log)
    assert "server-secret" not in log and "s3-secret" not in log and "pw@db" not in log and "redis" not in log
    assert not {"MADO_SECRET_KEY", "MADO_DATABASE_URL", "MADO_S3_SECRET_ACCESS_KEY", "CELERY_BROKER_URL"} & set(seen)
    assert seen["MMT_RUN_ID"] == "abc" and seen["MMT_API_TOKEN"] == "run-token"
    assert seen["CUDA_VISIBLE_DEVICES"] == "1"
    assert seen["PYTHONUNBUFFERED"] == "1" and seen["LANG"] == "C.UTF-8" and seen["PATH"] == os.environ["PATH"]
    assert set(seen) <= {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "TMPDIR",
        "PYTHONUNBUFFERED",
        "MMT_RUN_ID",
        "MMT_API_TOKEN",
        "CUDA_VISIBLE_DEVICES",
        "LC_CTYPE",
    }


@pytest.mark.parametrize("name", ["MADO_SECRET_KEY", "LD_PRELOAD", "PYTHONPATH", "mmt_lower"])
def test_child_env_refuses_anything_but_mmt_and_cuda_variables(name):
    with pytest.raises(ValueError, match=name):
        child_env({name: "x"})


def test_a_missing_program_raises_before_anything_runs(tmp_path):
    with pytest.raises(FileNotFoundError):
        run(["no-such-program-mado"], tmp_path)


def test_stop_sends_sigterm_and_the_code_may_exit_cleanly(tmp_path):
    marker = tmp_path / "terminated"
    argv = script(
        tmp_path,
        f"""
        import signal, sys, time
        def on_term(signum, frame):
            open({str(marker)!r}, "w").write("SIGTERM")
            print("got SIGTERM, saving", flush=True)
            sys.exit(7)
        signal.signal(signal.SIGTERM, on_term)
        print("ready", flush=True)
        time.sleep(60)
    """,
    )
    seen: list[str] = []
    asked = []

    def should_stop():
        asked.append(time.monotonic())
        return "ready" in "".join(seen)

    started = time.monotonic()
    outcome = run_process(
        argv, cwd=tmp_path, env=child_env({}), on_output=seen.append, should_stop=should_stop, grace_s=30, poll_s=0.1
    )
    assert (outcome.exit_code, outcome.stopped, outcome.killed) == (7, True, False)
    assert marker.read_text() == "SIGTERM"
    assert "got SIGTERM, saving" in "".join(seen)
    assert time.monotonic() - started < 10  # well inside the grace period
    assert 0 <= outcome.stop_to_exit_s < 10
    assert len(asked) >= 1


def test_stop_sends_the_chosen_signal_once(tmp_path):
    argv = script(
        tmp_path,
        """
        import signal, sys, time
        received = []
        signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
        print("ready", flush=True)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            time.sleep(0.05)
        print(f"received {len(received)}", flush=True)
        sys.exit(5)
    """,
    )
    seen: list[str] = []
    outcome = run_process(
        argv,
        cwd=tmp_path,
        env=child_env({}),
        on_output=seen.append,
        should_stop=lambda: "ready" in "".join(seen),  # keeps saying yes: one signal all the same
        grace_s=30,
        poll_s=0.1,
        stop_signal=signal.SIGUSR1,
    )
    assert (outcome.exit_code, outcome.stopped, outcome.killed) == (5, True, False)
    assert "received 1\n" in "".join(seen)


def test_code_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    argv = script(
        tmp_path,
        """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        while True:
            time.sleep(0.1)
    """,
    )
    seen: list[str] = []
    killed = []
    started = time.monotonic()
    outcome = run_process(
        argv,
        cwd=tmp_path,
        env=child_env({}),
        on_output=seen.append,
        should_stop=lambda: "ready" in "".join(seen),
        grace_s=1.0,
        poll_s=0.1,
        on_kill=lambda: killed.append(True),
    )
    elapsed = time.monotonic() - started
    assert (outcome.exit_code, outcome.stopped, outcome.killed) == (-signal.SIGKILL, True, True)
    assert killed == [True]
    assert elapsed >= 1.0, "SIGKILL came before the grace period ended"
    assert elapsed < 15


def test_stop_kills_the_whole_process_group_grandchildren_included(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    argv = script(
        tmp_path,
        f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print("ready", flush=True)
        time.sleep(120)
    """,
    )
    seen: list[str] = []
    outcome = run_process(
        argv,
        cwd=tmp_path,
        env=child_env({}),
        on_output=seen.append,
        should_stop=lambda: "ready" in "".join(seen),
        grace_s=1.0,
        poll_s=0.1,
    )
    grandchild = int(pid_file.read_text())
    assert outcome.stopped
    assert wait_for(lambda: not alive(grandchild), timeout=5), "the grandchild survived the stop"


def test_what_finished_code_leaves_running_in_its_group_is_killed(tmp_path):
    pid_file = tmp_path / "daemon.pid"
    argv = script(
        tmp_path,
        f"""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        open({str(pid_file)!r}, "w").write(str(child.pid))
    """,
    )
    started = time.monotonic()
    outcome, _, _ = run(argv, tmp_path)
    assert outcome == (0, False, None, False)
    assert time.monotonic() - started < 10
    assert wait_for(lambda: not alive(int(pid_file.read_text())), timeout=5)


def test_an_error_in_a_callback_kills_the_code_and_propagates(tmp_path):
    pid_file = tmp_path / "pid"
    argv = script(
        tmp_path,
        f"""
        import os, time
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        print("ready", flush=True)
        time.sleep(120)
    """,
    )

    def should_stop():
        if pid_file.exists():
            raise RuntimeError("database gone")
        return False

    with pytest.raises(RuntimeError, match="database gone"):
        run_process(
            argv, cwd=tmp_path, env=child_env({}), on_output=lambda text: None, should_stop=should_stop, poll_s=0.1
        )
    assert wait_for(lambda: not alive(int(pid_file.read_text())), timeout=5)


def test_the_code_leads_its_own_process_group(tmp_path):
    outcome, log, _ = run(
        script(
            tmp_path,
            """
        import os
        print(os.getpgid(0) == os.getpid(), os.getsid(0) == os.getpid())
    """,
        ),
        tmp_path,
    )
    assert log == "True True\n"
    assert os.getpgid(0) != 0


def test_the_code_dies_with_the_worker_that_started_it(tmp_path):
    """A worker killed by SIGKILL (OOM, lost host) must not leave the code running: the kernel kills it."""
    pid_file = tmp_path / "code.pid"
    code = script(
        tmp_path,
        f"""
        import os, time
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(120)
    """,
        name="code.py",
    )
    worker = script(
        tmp_path,
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from worker.runner import child_env, run_process
        run_process({code!r}, cwd={str(tmp_path)!r}, env=child_env({{}}), on_output=lambda text: None)
    """,
        name="fake_worker.py",
    )
    import subprocess

    fake_worker = subprocess.Popen(worker)
    try:
        assert wait_for(pid_file.exists)
        code_pid = int(pid_file.read_text())
        assert alive(code_pid)
        fake_worker.kill()
        fake_worker.wait()
        assert wait_for(lambda: not alive(code_pid), timeout=5), "the code outlived its worker"
    finally:
        fake_worker.kill()
