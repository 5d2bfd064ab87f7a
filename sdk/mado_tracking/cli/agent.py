"""``mado agent SWEEP_ID``: run a sweep's trials one after another on this machine
(docs/design/sweeps.md#sweeps, #requeue).

The loop: ``POST sweeps/{id}/claim/ {"agent": "<host>:<pid>"}`` hands out the
next trial (a requeued, preempted one first, then a new parameter set); the
agent starts the sweep's program with ``--<name>=<value>`` per parameter and
the environment ``MMT_RUN_ID`` (the trial's run id), ``MMT_RESUME=allow``,
``MMT_SWEEP_ID``, ``MMT_PROJECT``, ``MMT_API_URL``, ``MMT_API_TOKEN``, so the
program's ``start_run()`` starts or resumes the trial's own Run. A trial that
comes back with a checkpoint has it downloaded, verified and extracted first
(``mado_tracking.extract``): ``run.resume_checkpoint()`` returns it (docs/design/worker.md#extract).
When the program exits the agent reports ``{exit_code, preempted, agent}``
(``POST sweeps/{id}/trials/{n}/report/``; ``exit_code`` as ``Popen`` gives
it: -n when signal n killed the program). No trial to hand out: the agent
stops when the sweep is done, else asks again after ``--poll-interval``.

``--forward-signals``: the program runs in its own process group and the
agent passes SIGTERM, SIGUSR1 and SIGINT on to it; after any of them the
agent claims nothing more; a trial that got SIGTERM or SIGUSR1 is reported
``preempted``, and a program still alive ``--kill-grace`` seconds after a
SIGTERM is killed (SIGKILL). Without the flag the signals keep their default
effect (Ctrl-C in a terminal reaches the agent and the program alike).

``--max-failures N`` (default 3, like W&B's agent): after N trials in a row
that failed (non-zero exit, not preempted) the agent stops, so a broken
program does not burn through a whole random sweep.

Before the first claim the agent checks that the program's Python can import
the SDK and its dependencies (``mado_tracking.cli.interpreter``) and stops
with exit status 1 when it cannot, having claimed nothing.

Exit statuses: 0 the sweep is done or ``--count`` trials ran; 1 the server
refused or could not be reached (the message says what failed), the
trial's checkpoint did not verify, ``--max-failures`` trials failed in a
row, or the program could not be started (not found or not executable: the
trial is reported preempted, so it goes back to the queue with its Run still
pending); 128 + n after signal n stopped the agent.
"""

import json
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import click

from mado_tracking.cli._common import api_client, api_options, resolve_config
from mado_tracking.cli.interpreter import InterpreterUnfit, check_interpreter
from mado_tracking.client import ApiClient
from mado_tracking.config import ENV_API_TOKEN, ENV_API_URL, ENV_PROJECT, Config
from mado_tracking.errors import CheckpointError
from mado_tracking.extract import restore_checkpoint
from mado_tracking.resume import ENV_NAMES as RESUME_ENV_NAMES

ENV_SWEEP_ID = "MMT_SWEEP_ID"
FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
PREEMPTING = (signal.SIGTERM, signal.SIGUSR1)
TICK_S = 0.1  # how often waits look at the child and at a received signal


def parameter_argv(parameters: dict) -> list[str]:
    """``{"lr": 0.01, "hidden": 32}`` → ``["--lr=0.01", "--hidden=32"]``: text as is, anything else as JSON."""
    return [f"--{name}={value if isinstance(value, str) else json.dumps(value)}" for name, value in parameters.items()]


def trial_environment(
    config: Config, *, sweep_id: int, project: str, external_id: str, resume: dict[str, str]
) -> dict[str, str]:
    """The program's environment: ours, plus the trial's run id and server; ``resume`` = the ``MMT_RESUME_*`` variables
    or {}.

    ``MMT_MODE`` and any inherited ``MMT_RESUME_*`` are dropped: a trial is an
    online run and resumes only from its own checkpoint.
    """
    env = {name: value for name, value in os.environ.items() if name not in (*RESUME_ENV_NAMES, "MMT_MODE")}
    env.update(
        {
            "MMT_RUN_ID": external_id,
            "MMT_RESUME": "allow",
            ENV_SWEEP_ID: str(sweep_id),
            ENV_PROJECT: project,
            ENV_API_URL: config.api_url,
            ENV_API_TOKEN: config.api_token,
            **resume,
        }
    )
    return env


def describe_exit(returncode: int) -> str:
    """``"exited with status 1"``, or ``"was killed by SIGKILL"`` for Popen's ``-9``."""
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


class Agent:
    """One agent process: claims trials of ``sweep_id`` and runs them (see the module docstring)."""

    def __init__(
        self,
        client: ApiClient,
        config: Config,
        sweep_id: int,
        *,
        forward_signals: bool,
        poll_interval: float,
        kill_grace: float,
        max_failures: int = 3,
    ):
        self.client = client
        self.config = config
        self.sweep_id = sweep_id
        self.forward_signals = forward_signals
        self.poll_interval = poll_interval
        self.kill_grace = kill_grace
        self.max_failures = max_failures
        self.failures = 0  # trials in a row that failed (non-zero exit, not preempted)
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.stop_signal: int | None = None  # the first signal received: claim nothing more
        self.child: subprocess.Popen | None = None
        self.forwarded: list[int] = []  # signals passed to the current child
        self.kill_at: float | None = None
        self.unstartable: str | None = None  # why the program could not be started (then the agent stops)

    def run(self, count: int | None) -> int:
        """Claim and run trials until the sweep is done, ``count`` trials ran or a signal came; return the exit
        status (module docstring). Raises ``ApiError`` when the server refuses or stays unreachable."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in FORWARDED} if self.forward_signals else {}
        try:
            ran = 0
            while count is None or ran < count:
                if self.stop_signal is not None:
                    break
                answer = self.client.request(
                    "POST", f"sweeps/{self.sweep_id}/claim/", body={"agent": self.name}, attempts=3
                )
                if answer["trial"] is None:
                    if answer["done"]:
                        click.echo(f"sweep {self.sweep_id} is done: {answer.get('reason') or 'no trial left'}")
                        return 0
                    self._sleep(self.poll_interval)
                    continue
                self.run_trial(answer)
                ran += 1
                if self.failures >= self.max_failures:
                    raise click.ClickException(
                        f"{self.failures} trials in a row failed; stopping this agent (--max-failures "
                        f"{self.max_failures}). Run the program by hand to see why: {shlex.join(answer['program'])}"
                    )
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.stop_signal is not None:
            click.echo(f"agent {self.name} stopped by {signal.Signals(self.stop_signal).name}", err=True)
            return 128 + self.stop_signal
        click.echo(f"agent {self.name}: {ran} trial(s) ran (--count {count})")
        return 0

    def run_trial(self, answer: dict) -> None:
        """Run the claimed trial of ``answer`` (the claim's JSON) to its end and report its exit."""
        trial = answer["trial"]
        number = trial["number"]
        argv = [*answer["program"], *parameter_argv(trial["parameters"])]
        with tempfile.TemporaryDirectory(prefix=f"mado-agent-{self.sweep_id}-{number}-") as scratch:
            try:
                resume = self._checkpoint(trial, Path(scratch))
                env = trial_environment(
                    self.config,
                    sweep_id=self.sweep_id,
                    project=answer["project"],
                    external_id=trial["external_id"],
                    resume=resume,
                )
                returncode = self._execute(number, trial, argv, env)
            finally:
                _make_removable(Path(scratch))
        # A program that cannot be started (not found, not executable) never started its Run: the trial goes
        # back to the queue (its Run stays pending) and the agent stops, instead of failing trial after trial.
        preempted = (
            returncode is None or self.unstartable is not None or any(sig in PREEMPTING for sig in self.forwarded)
        )
        if returncode is None:  # never started: reported as stopped by the signal that came first
            returncode = -self.stop_signal
            outcome = f"was not started: {signal.Signals(self.stop_signal).name} came first"
        else:
            outcome = describe_exit(returncode)
        self.client.request(
            "POST",
            f"sweeps/{self.sweep_id}/trials/{number}/report/",
            body={"exit_code": returncode, "preempted": preempted, "agent": self.name},
            attempts=5,
        )
        if self.unstartable is not None:
            raise click.ClickException(
                f"trial {number}: cannot start {argv[0]!r}: {self.unstartable}; the trial goes back to the queue "
                "and this agent stops. The sweep's program must be a command this machine can run, e.g. "
                "'python train.py' rather than 'train.py'"
            )
        self.failures = self.failures + 1 if returncode != 0 and not preempted else 0
        click.echo(f"trial {number} {outcome}" + (" (preempted)" if preempted else ""))

    def _checkpoint(self, trial: dict, scratch: Path) -> dict[str, str]:
        latest = trial.get("latest_checkpoint")
        if not latest:
            return {}
        try:
            resume = restore_checkpoint(self.client, latest["id"], scratch)
        except CheckpointError as error:
            raise click.ClickException(f"trial {trial['number']}: {error}") from None
        click.echo(
            f"trial {trial['number']}: resuming run {trial['external_id']} from checkpoint {latest['id']} "
            f"(step {latest['step']})"
        )
        return resume

    def _execute(self, number: int, trial: dict, argv: list[str], env: dict[str, str]) -> int | None:
        """Start and wait for the program; its return code, None when a signal came before it started."""
        if self.stop_signal is not None:
            return None
        requeued = f", requeued {trial['requeue_count']}x" if trial.get("requeue_count") else ""
        click.echo(f"trial {number} (run {trial['external_id']}{requeued}): {shlex.join(argv)}")
        self.forwarded, self.kill_at = [], None
        try:
            self.child = subprocess.Popen(argv, env=env, start_new_session=self.forward_signals)
        except OSError as error:
            self.unstartable = str(error)
            return 127
        if self.stop_signal is not None and not self.forwarded:  # it came while the child was being started
            self._forward(self.stop_signal)
        try:
            while self.child.poll() is None:
                if self.kill_at is not None and time.monotonic() >= self.kill_at:
                    click.echo(f"trial {number}: still running {self.kill_grace:g} s after SIGTERM; SIGKILL", err=True)
                    os.killpg(self.child.pid, signal.SIGKILL)
                    self.kill_at = None
                time.sleep(TICK_S)
            return self.child.returncode
        finally:
            self.child = None

    def _on_signal(self, signum: int, frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
        if self.child is not None and self.child.poll() is None:
            self._forward(signum)

    def _forward(self, signum: int) -> None:
        try:
            self.child.send_signal(signum)
        except ProcessLookupError:
            return
        self.forwarded.append(signum)
        if signum == signal.SIGTERM and self.forwarded.count(signal.SIGTERM) == 1:  # the grace starts once
            self.kill_at = time.monotonic() + self.kill_grace

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.stop_signal is None and time.monotonic() < deadline:
            time.sleep(min(TICK_S, max(deadline - time.monotonic(), 0)))


def _make_removable(directory: Path) -> None:
    """The extracted checkpoint is read-only: give its directories back their write bit so it can be removed."""
    for current, _, _ in os.walk(directory):
        os.chmod(current, 0o700)


@click.command("agent")
@click.argument("sweep_id", metavar="SWEEP_ID", type=click.IntRange(min=1))
@click.option("--count", type=click.IntRange(min=1), default=None, help="run at most N trials, then stop")
@click.option(
    "--forward-signals",
    is_flag=True,
    help="pass SIGTERM, SIGUSR1 and SIGINT on to the program; after one, claim nothing more "
    "(SIGTERM / SIGUSR1: the trial is reported preempted and requeued)",
)
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0.05),
    default=10.0,
    show_default=True,
    help="seconds between claims while every trial is taken but the sweep is not done",
)
@click.option(
    "--kill-grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="with --forward-signals: SIGKILL the program this many seconds after a forwarded SIGTERM",
)
@click.option(
    "--max-failures",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="stop after this many trials in a row failed (non-zero exit, not preempted)",
)
@api_options
@click.pass_context
def agent(
    ctx: click.Context,
    sweep_id: int,
    count: int | None,
    forward_signals: bool,
    poll_interval: float,
    kill_grace: float,
    max_failures: int,
    api_url: str | None,
    api_token: str | None,
) -> None:
    """Claim trials of sweep SWEEP_ID and run its program for each, until the sweep is done.

    A preempted trial comes back first and resumes under its own run id from
    its latest checkpoint. Exit 0 when the sweep is done or N trials ran.
    Before claiming anything, the agent checks that the program's Python can
    import the mado SDK (else it stops: activate the project's .venv).

    \f
    docs/design/sweeps.md#sweeps, #requeue (click shows nothing from the line above on).
    """
    config = resolve_config(ctx, api_url, api_token)
    with api_client(ctx, config.api_url, config.api_token, f"agent on sweep {sweep_id}") as client:
        program = client.request("GET", f"sweeps/{sweep_id}/", attempts=3)["program"]
        try:
            check_interpreter(program, env=dict(os.environ))
        except InterpreterUnfit as unfit:
            raise click.ClickException(f"{unfit} No trial was claimed.") from None
        status = Agent(
            client,
            config,
            sweep_id,
            forward_signals=forward_signals,
            poll_interval=poll_interval,
            kill_grace=kill_grace,
            max_failures=max_failures,
        ).run(count)
    ctx.exit(status)
