"""``mado probe-resume``: does a training loop resume exactly? Three Jobs of one Code version answer it
(docs/design/checkpoints.md#probe; docs/jobs.md, "Reading the verdict").

1. an uninterrupted Job, and one stopped at step K (the Run parameter
   ``mado_probe_fail_at_step``, honoured by the SDK: ``mado_tracking.probe_stop``),
   launched together on the queue;
2. once both ended, the stopped one resumed from its latest checkpoint
   (``POST jobs/{id}/resume-latest/``);
3. the resumed Run's restore report and parity verdict (against the stopped
   Run, from the server) and its curves compared with the uninterrupted
   Run's from the checkpoint's step on (``mado_tracking.parity``); when
   either diverged, the first differing step and each part the report names
   as its possible cause (not restored, changed after load, not declared).

Exit status: 0 when both verdicts are ``identical`` or ``within_tolerance``
(an ``unknown`` server verdict, e.g. K right after a checkpoint, defers to
the other), 1 otherwise or when a Job did not end as expected, 4 when
``--timeout`` passed first; 1 and 2 as every command.
"""

import time

import click

from mado_tracking import parity
from mado_tracking.cli._common import EXIT_TIMEOUT, api_client, api_options, pages, project_option
from mado_tracking.cli.job_inputs import resolve_code_version
from mado_tracking.cli.parity import STATUS_WORDS, parts_with
from mado_tracking.probe_stop import END_AT_STEP, FAIL_AT_STEP

FINAL = frozenset({"succeeded", "failed", "aborted", "preempted"})
OK = ("identical", "within_tolerance")
PARITY_WAIT_S = 30.0


class ProbeTimeout(click.ClickException):
    exit_code = EXIT_TIMEOUT


def _wait(client, job_id: int, deadline: float, interval: float) -> dict:
    while True:
        job = client.request("GET", f"jobs/{job_id}/", attempts=3)
        if job["status"] in FINAL:
            return job
        if time.monotonic() >= deadline:
            raise ProbeTimeout(f"job {job_id} is still {job['status']} after --timeout")
        time.sleep(interval)


def _launch(client, body: dict, name: str, parameters: dict) -> dict:
    return client.request("POST", "jobs/", body={**body, "name": name, "parameters": parameters}, attempts=1)


def _series(client, run_id: int, from_step: int) -> dict:
    """``{key: {step: value}}`` of the Run's points at ``from_step`` and after (``system/…`` keys aside)."""
    keys = client.request("GET", f"runs/{run_id}/metrics/", attempts=3).get("keys") or []
    found = {}
    for key in keys:
        if key.startswith(parity.SYSTEM_PREFIX):
            continue
        points = pages(client, f"runs/{run_id}/metrics/", {"key": key})
        found[key] = {point["step"]: point["value"] for point in points if point["step"] >= from_step}
    return found


def _server_verdict(client, run_id: int, deadline: float, interval: float) -> dict:
    """The resumed Run's resource, once its ``parity`` is there (a server without it: at once)."""
    waited = time.monotonic() + PARITY_WAIT_S
    while True:
        run = client.request("GET", f"runs/{run_id}/", attempts=3)
        if "parity" not in run or run["parity"] is not None or time.monotonic() >= min(waited, deadline):
            return run
        time.sleep(interval)


def _restore_lines(run: dict, job: dict) -> list[str]:
    report = run.get("restore_report") or job.get("restore_report")
    if report:
        details = report.get("details") or {}
        lines = []
        for status, said in (
            ("not_restored", "not restored from the checkpoint"),
            ("not_declared", STATUS_WORDS["not_declared"]),
        ):
            named = parts_with(report, status)
            if named:
                listed = "; ".join(f"{part} — {details[part]}" if details.get(part) else part for part in named)
                lines.append(f"{said}: {listed}")
        return lines or ["restore report: every part of the checkpoint was restored"]
    ignored = run.get("resume_ignored_at_step", job.get("resume_ignored_at_step"))
    if ignored is not None:
        return [f"resume ignored? the resumed run loaded no checkpoint (first step {ignored})"]
    return ["restore report: none (the code did not load its checkpoint with mado_tracking.torch.load_checkpoint)"]


def _cause_lines(report: dict | None, verdicts: list[dict | None]) -> list[str]:
    """When a verdict diverged: the first differing step of all, and the parts of the restore report that may
    explain it (not restored, changed after load, not declared, not checked with a reason)."""
    diverged = [v for v in verdicts if v and v.get("verdict") == "diverged" and isinstance(v.get("step"), int)]
    if not diverged:
        return []
    first = min(diverged, key=lambda verdict: verdict["step"])
    lines = [f"first differing step: {first['step']} ({first.get('key')})"]
    if not report:
        return [*lines, "cause: not named (the resumed run sent no restore report)"]
    details = report.get("details") or {}
    named = [
        (part, status)
        for status in ("not_restored", "not_declared", "unknown")
        for part in parts_with(report, status)
        if status != "unknown" or details.get(part)
    ]
    if not named:
        return [*lines, "cause: not named (the restore report says every part it checked was restored)"]
    for part, status in named:
        lines.append(f"cause: {part} {STATUS_WORDS[status]}" + (f" — {details[part]}" if details.get(part) else ""))
    return lines


def _worst(verdicts: list[str]) -> str:
    known = [v for v in verdicts if v != "unknown"] or verdicts
    return max(known, key=parity.VERDICTS.index) if known else "unknown"


@click.command("probe-resume")
@project_option(help_text="project slug: needed to name the code version as NAME[:VERSION] [env MMT_PROJECT]")
@click.option("--code-version", "code_version", required=True, metavar="ID|NAME[:VERSION]", help="the code to probe")
@click.option(
    "--kill-at-step",
    "kill_at",
    required=True,
    type=click.IntRange(min=1),
    metavar="K",
    help="stop the interrupted run when it logs step K; pick a K a few steps after a checkpoint",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="end every run at step N (default: where the code ends)",
)
@click.option("--queue", default=None, help="execution target (default: the server's default queue)")
@click.option(
    "--tolerance",
    type=click.FloatRange(min=0),
    default=None,
    help="relative tolerance against the uninterrupted run (default: the project's, else 1e-6)",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=3600,
    show_default=True,
    help="seconds to wait for the three Jobs",
)
@click.option(
    "--interval", type=click.FloatRange(min=0.05), default=2.0, show_default=True, help="seconds between polls"
)
@api_options
@click.pass_context
def probe_resume(
    ctx: click.Context,
    project: str | None,
    code_version: str,
    kill_at: int,
    steps: int | None,
    queue: str | None,
    tolerance: float | None,
    timeout: float,
    interval: float,
    api_url: str | None,
    api_token: str | None,
) -> None:
    """Check that a training loop resumes exactly: run the code uninterrupted, and stopped at step K then resumed
    from its latest checkpoint, as Jobs; print what the resumed run did not restore and where its curves part.

    Exits 0 when the resumed run's curves are identical (or within tolerance) to the interrupted and the
    uninterrupted run's, 1 otherwise, 4 on --timeout.

    \f
    docs/design/checkpoints.md#probe (click shows nothing from the line above on).
    """
    if steps is not None and steps <= kill_at:
        raise click.BadParameter(f"must be above --kill-at-step {kill_at}", param_hint="--steps")
    deadline = time.monotonic() + timeout
    ending = {END_AT_STEP: steps} if steps is not None else {}
    with api_client(ctx, api_url, api_token, "cannot probe the resume") as client:
        body = {"code_version_id": resolve_code_version(client, code_version, project), "kind": "training"}
        if queue:
            body["queue"] = queue
        reference = _launch(client, body, "probe: uninterrupted", ending)
        stopped = _launch(client, body, f"probe: stopped at step {kill_at}", {**ending, FAIL_AT_STEP: kill_at})
        click.echo(
            f"probe-resume of {code_version}: jobs {reference['id']} (uninterrupted) and {stopped['id']} "
            f"(stopped at step {kill_at}) on queue {stopped['queue']}"
        )
        reference, stopped = (_wait(client, job["id"], deadline, interval) for job in (reference, stopped))
        if reference["status"] != "succeeded" or stopped["status"] != "failed":
            raise click.ClickException(
                f"job {reference['id']} (uninterrupted) ended {reference['status']} and job {stopped['id']} "
                f"(stopped) {stopped['status']}; expected succeeded and failed: does the code log metrics at step "
                f"{kill_at} and save a checkpoint before it? (mado job logs {stopped['id']})"
            )
        resumed = client.request("POST", f"jobs/{stopped['id']}/resume-latest/", body={"queue": queue}, attempts=1)
        click.echo(
            f"job {resumed['id']} resumes run {stopped['run_id']} from checkpoint "
            f"{resumed.get('source_checkpoint_id')} (step {resumed.get('source_checkpoint_step')})"
        )
        resumed = _wait(client, resumed["id"], deadline, interval)
        if resumed["status"] != "succeeded":
            raise click.ClickException(
                f"the resumed job {resumed['id']} ended {resumed['status']} (mado job logs {resumed['id']})"
            )
        run = _server_verdict(client, resumed["run_id"], deadline, interval)
        server = run.get("parity")
        from_step = resumed.get("source_checkpoint_step") or 0
        eps = tolerance if tolerance is not None else (server or {}).get("tolerance") or parity.DEFAULT_TOLERANCE
        against = parity.compare(
            _series(client, reference["run_id"], from_step),
            _series(client, resumed["run_id"], from_step),
            from_step=from_step,
            tolerance=eps,
        )
    for line in _restore_lines(run, resumed):
        click.echo(line)
    if "parity" in run:
        click.echo(f"parity with the interrupted run: {parity.describe(server, 'interrupted', 'resumed')}")
    else:
        click.echo("parity with the interrupted run: the server gives no verdict")
    click.echo(f"against the uninterrupted run: {parity.describe(against, 'uninterrupted', 'resumed')}")
    for line in _cause_lines(run.get("restore_report") or resumed.get("restore_report"), [server, against]):
        click.echo(line)
    verdicts = [against["verdict"], *([server["verdict"]] if server and server.get("verdict") else [])]
    verdict = _worst(verdicts)
    click.echo(f"verdict: {verdict}")
    if verdict not in OK:
        ctx.exit(1)
