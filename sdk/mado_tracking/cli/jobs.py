"""``mado job launch | list | show | abort | resume | continue | logs`` (docs/design/resume.md;
docs/design/worker.md#subprocess; docs/api.md "Jobs").

Every command is one or a few calls of ``/api/v1/``; the server checks who
may do what and answers a refusal with ``{"error", "detail", "field"}``,
which the command prints (``_common.describe``) before exiting with 1.
A code version is named by its id or, within a Project, as ``NAME`` (its
latest version) or ``NAME:VERSION``.
"""

import time

import click

from mado_tracking.cli._common import (
    EXIT_JOB_FAILED,
    EXIT_TIMEOUT,
    api_client,
    api_options,
    local_time,
    pages,
    project_option,
    table,
)
from mado_tracking.cli.job_inputs import parse_parameters, resolve_code_version
from mado_tracking.cli.parity import print_resume_facts
from mado_tracking.run import RUN_KINDS

JOB_STATUSES = ("queued", "running", "succeeded", "failed", "aborted", "preempted")
FINAL_STATUSES = frozenset({"succeeded", "failed", "aborted", "preempted"})
LOG_PAGE = 1000  # the logs endpoint's largest ?limit=


def _job_line(job: dict) -> str:
    resumed = ""
    if job.get("kind") in ("resume", "continue") and job.get("source_checkpoint_id") is not None:
        resumed = (
            f", {job['kind']} of run {job.get('resumed_from_run_id')} from checkpoint "
            f"{job['source_checkpoint_id']} (step {job.get('source_checkpoint_step')})"
        )
    return (
        f"job {job['id']} {job['status']} on {job['queue']}: run {job['run_id']} ({job.get('run_external_id', '')})"
        f" in project {job.get('project', '')}{resumed}"
    )


def _print_job(job: dict, quiet: bool) -> None:
    if quiet:
        click.echo(job["id"])
        return
    click.echo(_job_line(job))
    if job.get("run_url"):
        click.echo(job["run_url"])


@click.group()
def job() -> None:
    """Jobs: a Code version run by a worker on a queue, as a new Run."""


@job.command("launch")
@project_option(
    help_text="project slug: needed to name the code version as NAME[:VERSION]; checks an id [env MMT_PROJECT]"
)
@click.option(
    "--code-version",
    "code_version",
    required=True,
    metavar="ID|NAME[:VERSION]",
    help="the code version to run (mado code push prints its id)",
)
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="a parameter recorded on the Run (repeatable; JSON values such as 0.05, true, [1,2] are decoded); "
    "the code gets its arguments from the entrypoint",
)
@click.option(
    "--dataset-version",
    "dataset_versions",
    multiple=True,
    type=click.IntRange(min=1),
    metavar="ID",
    help="an input dataset version id (repeatable)",
)
@click.option("--queue", default=None, help="execution target (default: the server's default queue)")
@click.option(
    "--max-retries",
    type=click.IntRange(0, 10),
    default=0,
    show_default=True,
    help="automatic fresh attempts after a failure; a retry starts from scratch, never from a checkpoint",
)
@click.option(
    "--max-restarts",
    type=click.IntRange(0, 10),
    default=None,
    help="automatic resumes from the latest checkpoint after a preemption or a lost worker "
    "(default: the project's setting)",
)
@click.option(
    "--nproc-per-node",
    "nproc_per_node",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="processes on the worker: above 1 the code runs under torchrun, one Run for all ranks",
)
@click.option("--name", default="", help="name of the Run")
@click.option("--kind", type=click.Choice(RUN_KINDS), default="training", show_default=True, help="run kind")
@click.option("--quiet", "-q", is_flag=True, help="print only the new Job's id")
@api_options
@click.pass_context
def job_launch(
    ctx: click.Context,
    project: str | None,
    code_version: str,
    params: tuple[str, ...],
    dataset_versions: tuple[int, ...],
    queue: str | None,
    max_retries: int,
    max_restarts: int | None,
    nproc_per_node: int,
    name: str,
    kind: str,
    quiet: bool,
    api_url: str | None,
    api_token: str | None,
) -> None:
    """Launch a Job: a new Run of the code version, sent to a worker of the queue.

    \f
    docs/design/worker.md#fetch, #distributed (click shows nothing from the line above on).
    """
    parameters = parse_parameters(params)
    with api_client(ctx, api_url, api_token, "cannot launch the job") as client:
        body = {
            "code_version_id": resolve_code_version(client, code_version, project),
            "parameters": parameters,
            "input_dataset_version_ids": list(dataset_versions),
            "name": name,
            "kind": kind,
            "max_retries": max_retries,
            "nproc_per_node": nproc_per_node,
        }
        if queue:
            body["queue"] = queue
        if max_restarts is not None:
            body["max_restarts"] = max_restarts
        created = client.request("POST", "jobs/", body=body, attempts=1)
    _print_job(created, quiet)


@job.command("list")
@project_option()
@click.option("--status", type=click.Choice(JOB_STATUSES), default=None, help="only jobs in this state")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="at most this many jobs")
@api_options
@click.pass_context
def job_list(
    ctx: click.Context, project: str | None, status: str | None, limit: int, api_url: str | None, api_token: str | None
) -> None:
    """List jobs, newest first (a resumed Job has kind resume); CODE is NAME:VERSION, as --code-version takes it."""
    params = {key: value for key, value in {"project": project, "status": status}.items() if value}
    with api_client(ctx, api_url, api_token, "cannot list jobs") as client:
        rows = list(pages(client, "jobs/", params, limit=limit))
    click.echo(
        table(
            ["ID", "STATUS", "KIND", "QUEUE", "RUN", "NAME", "CODE", "BY", "ATTEMPT", "CREATED"],
            [
                [
                    str(j["id"]),
                    j["status"],
                    j["kind"],
                    j["queue"],
                    str(j["run_id"]),
                    j.get("run_name", ""),
                    f"{j.get('code')}:{j.get('code_version')}",
                    j.get("created_by", ""),
                    str(j.get("attempt", "")),
                    local_time(j.get("created_at")),
                ]
                for j in rows
            ],
            empty="no jobs",
        )
    )


@job.command("show")
@click.argument("job_id", metavar="JOB", type=click.IntRange(min=1))
@api_options
@click.pass_context
def job_show(ctx: click.Context, job_id: int, api_url: str | None, api_token: str | None) -> None:
    """Show one Job: state, error, lineage, and whether you may resume it."""
    with api_client(ctx, api_url, api_token, f"cannot read job {job_id}") as client:
        found = client.request("GET", f"jobs/{job_id}/", attempts=3)
    click.echo(_job_line(found))
    for label, key in (
        ("error", "error"),
        ("exit code", "exit_code"),
        ("worker", "worker_host"),
        ("created by", "created_by"),
        ("attempt", "attempt"),
        ("max retries", "max_retries"),
        ("max restarts", "max_restarts"),
        ("restarts", "restarts"),
        ("restart of job", "restart_of_id"),
        ("restarted as job", "restart_id"),
        ("processes per node", "nproc_per_node"),
    ):
        if found.get(key) not in (None, ""):
            click.echo(f"  {label}: {found[key]}")
    for label, key in (("created", "created_at"), ("started", "started_at"), ("ended", "ended_at")):
        if found.get(key):
            click.echo(f"  {label}: {local_time(found[key])}")
    print_resume_facts(found)
    refusal = found.get("resume_refusal")
    if found["status"] in ("failed", "aborted", "preempted"):
        click.echo(f"  resume: {refusal}" if refusal else f"  resume: mado job resume {job_id} --latest")
    if found.get("run_url"):
        click.echo(f"  {found['run_url']}")


@job.command("abort")
@click.argument("job_id", metavar="JOB", type=click.IntRange(min=1))
@api_options
@click.pass_context
def job_abort(ctx: click.Context, job_id: int, api_url: str | None, api_token: str | None) -> None:
    """Abort a Job: a queued one ends at once; a running one once its worker stopped the code (SIGTERM, SIGKILL)."""
    with api_client(ctx, api_url, api_token, f"cannot abort job {job_id}") as client:
        found = client.request("POST", f"jobs/{job_id}/abort/", attempts=3)
    if found["status"] == "aborted":
        click.echo(f"job {job_id} aborted")
    else:
        click.echo(f"job {job_id}: abort requested; it ends aborted once its worker has stopped the code")


@job.command("resume")
@click.argument("job_id", metavar="JOB", type=click.IntRange(min=1))
@click.option("--latest", is_flag=True, help="from the Run's checkpoint with the highest step")
@click.option(
    "--checkpoint",
    "checkpoint_id",
    type=click.IntRange(min=1),
    default=None,
    metavar="ID",
    help="from this checkpoint of the Job's Run",
)
@click.option(
    "--code-version",
    "code_version",
    default=None,
    metavar="ID|NAME[:VERSION]",
    help="another version of the same Code (default: the Job's)",
)
@click.option("--queue", default=None, help="execution target (default: the Job's)")
@click.option(
    "--nproc-per-node",
    "nproc_per_node",
    type=click.IntRange(1, 256),
    default=None,
    help="processes on the worker (default: the Job's); a sharded checkpoint is resharded to it",
)
@click.option("--quiet", "-q", is_flag=True, help="print only the new Job's id")
@api_options
@click.pass_context
def job_resume(
    ctx: click.Context,
    job_id: int,
    latest: bool,
    checkpoint_id: int | None,
    code_version: str | None,
    queue: str | None,
    nproc_per_node: int | None,
    quiet: bool,
    api_url: str | None,
    api_token: str | None,
) -> None:
    """Resume a failed, aborted or preempted Job as a new Run and Job, from a checkpoint of its Run.

    The new Run records the Job's Run as its parent and the checkpoint as its
    source; the code gets the checkpoint through ``run.resume_checkpoint()``.

    \f
    docs/design/resume.md; docs/design/worker.md#distributed (click shows nothing from the line above on).
    """
    if latest == (checkpoint_id is not None):
        raise click.UsageError("give either --latest or --checkpoint ID")
    with api_client(ctx, api_url, api_token, f"cannot resume job {job_id}") as client:
        source = client.request("GET", f"jobs/{job_id}/", attempts=3)
        body = {"queue": queue, "nproc_per_node": nproc_per_node}
        if code_version is not None:
            body["code_version_id"] = resolve_code_version(client, code_version, source["project"])
        if latest:
            created = client.request("POST", f"jobs/{job_id}/resume-latest/", body=body, attempts=1)
        else:
            checkpoint = client.request("GET", f"checkpoints/{checkpoint_id}/", attempts=3)
            if checkpoint["run_id"] != source["run_id"]:
                raise click.ClickException(
                    f"cannot resume job {job_id}: checkpoint {checkpoint_id} belongs to run {checkpoint['run_id']}, "
                    f"not to run {source['run_id']} of the job (--latest also finds a resumed Run's source checkpoint)"
                )
            created = client.request("POST", f"checkpoints/{checkpoint_id}/resume/", body=body, attempts=1)
    _print_job(created, quiet)


@job.command("continue")
@click.argument("checkpoint_id", metavar="CHECKPOINT", type=click.IntRange(min=1))
@click.option(
    "--dataset-version",
    "dataset_versions",
    multiple=True,
    type=click.IntRange(min=1),
    metavar="ID",
    help="the new Run's whole data set (repeatable; default: the source Run's data at the checkpoint's step)",
)
@click.option(
    "--add-dataset-version",
    "added",
    multiple=True,
    type=click.IntRange(min=1),
    metavar="ID",
    help="a dataset version added to that set (repeatable): the data mix changed",
)
@click.option(
    "--code-version",
    "code_version",
    default=None,
    metavar="ID|NAME[:VERSION]",
    help="a version of the source Run's Code (default: the version the source Run ran)",
)
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="change a parameter of the source Run's, recorded on the new Run (repeatable; JSON values are "
    "decoded); the code reads run.parameters, its command line comes from the entrypoint",
)
@click.option("--queue", default=None, help="execution target (default: the source Run's Job's, else the server's)")
@click.option(
    "--nproc-per-node",
    "nproc_per_node",
    type=click.IntRange(1, 256),
    default=None,
    help="processes on the worker (default: the source Run's Job's, else 1)",
)
@click.option("--name", default="", help="name of the new Run")
@click.option("--quiet", "-q", is_flag=True, help="print only the new Job's id")
@api_options
@click.pass_context
def job_continue(
    ctx: click.Context,
    checkpoint_id: int,
    dataset_versions: tuple[int, ...],
    added: tuple[int, ...],
    code_version: str | None,
    params: tuple[str, ...],
    queue: str | None,
    nproc_per_node: int | None,
    name: str,
    quiet: bool,
    api_url: str | None,
    api_token: str | None,
) -> None:
    """Continue training from checkpoint CHECKPOINT as a new Run and Job, with the same or a changed data mix.

    The source Run may be in any state (a finished one too) and is only read.
    The new Run records it as its parent and the checkpoint as its source;
    when its data differs from the source's at the checkpoint's step, a data
    stage at that step records what was added and removed.

    \f
    docs/design/runs.md#data-stages; docs/design/resume.md#continue, #continue-lineage;
    docs/design/worker.md#distributed (click shows nothing from the line above on).
    """
    changed = parse_parameters(params)
    with api_client(ctx, api_url, api_token, f"cannot continue from checkpoint {checkpoint_id}") as client:
        checkpoint = client.request("GET", f"checkpoints/{checkpoint_id}/", attempts=3)
        source = client.request("GET", f"runs/{checkpoint['run_id']}/", attempts=3)
        if code_version is not None:
            version_id = resolve_code_version(client, code_version, source["project"])
        elif source.get("code_version_id") is not None:
            version_id = source["code_version_id"]
        else:
            raise click.UsageError(f"run {source['id']} ran no registered Code: give --code-version")
        data = list(dataset_versions)
        if not data:
            data = client.request(
                "GET", f"runs/{source['id']}/data-stages/", params={"at_step": checkpoint["step"]}, attempts=3
            )["dataset_version_ids"]
        body = {
            "code_version_id": version_id,
            "input_dataset_version_ids": list(dict.fromkeys([*data, *added])),
            "parameters": {**(source.get("parameters") or {}), **changed} if changed else None,
            "queue": queue,
            "nproc_per_node": nproc_per_node,
            "name": name,
        }
        created = client.request("POST", f"checkpoints/{checkpoint_id}/continue/", body=body, attempts=1)
    _print_job(created, quiet)


@job.command("logs")
@click.argument("job_id", metavar="JOB", type=click.IntRange(min=1))
@click.option("--follow", "-f", is_flag=True, help="keep printing until the Job has ended")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="seconds between polls with --follow",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="with --follow: give up after this many seconds (exit 4)",
)
@api_options
@click.pass_context
def job_logs(
    ctx: click.Context,
    job_id: int,
    follow: bool,
    interval: float,
    timeout: float | None,
    api_url: str | None,
    api_token: str | None,
) -> None:
    """Print the Job's output (the code's stdout and stderr, and the worker's [mado] lines).

    With --follow, polls until the Job has ended, then prints its final state
    on stderr and exits 0 when it succeeded, 3 when it failed, was aborted or preempted,
    4 when --timeout passed first.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    after, truncated, status = 0, False, None
    try:
        with api_client(ctx, api_url, api_token, f"cannot read the log of job {job_id}") as client:
            while True:
                page = client.request("GET", f"jobs/{job_id}/logs/", params={"after_seq": after, "limit": LOG_PAGE})
                for chunk in page["results"]:
                    click.echo(chunk["text"], nl=False)
                after, truncated, status = page["next_after_seq"], page["truncated"], page["job_status"]
                if len(page["results"]) >= LOG_PAGE:
                    continue  # more is waiting: no pause
                if not follow or page["finished"]:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    click.echo(f"job {job_id} is still {status} after {timeout:g} s", err=True)
                    ctx.exit(EXIT_TIMEOUT)
                time.sleep(interval)
            final = client.request("GET", f"jobs/{job_id}/", attempts=3) if follow else None
    except KeyboardInterrupt:
        ctx.exit(130)
    if truncated:
        click.echo("[the log reached the server's size limit: the rest was not kept]", err=True)
    if final is None:
        return
    code = "" if final.get("exit_code") is None else f", exit code {final['exit_code']}"
    error = f": {final['error']}" if final.get("error") else ""
    click.echo(f"job {job_id} {final['status']}{code}{error}", err=True)
    if final["status"] != "succeeded":
        ctx.exit(EXIT_JOB_FAILED)
