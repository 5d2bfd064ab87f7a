"""``mado runs list`` and ``mado sync DIR`` (docs/design/runs.md#offline; docs/design/interfaces.md#surfaces)."""

import click

from mado_tracking.cli._common import api_client, api_options, local_time, pages, project_option, resolve_config, table
from mado_tracking.errors import MadoError
from mado_tracking.run import RUN_KINDS
from mado_tracking.sync import sync_offline_run

RUN_STATUSES = ("pending", "running", "finished", "failed", "aborted", "crashed", "preempting", "preempted")


@click.group()
def runs() -> None:
    """Runs of your Projects."""


@runs.command("list")
@project_option()
@click.option("--status", type=click.Choice(RUN_STATUSES), default=None, help="only runs in this state")
@click.option("--kind", type=click.Choice(RUN_KINDS), default=None, help="only runs of this kind")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="at most this many runs")
@api_options
@click.pass_context
def runs_list(
    ctx: click.Context,
    project: str | None,
    status: str | None,
    kind: str | None,
    limit: int,
    api_url: str | None,
    api_token: str | None,
) -> None:
    """List runs, newest first: id, run id, name, status, kind, created (local time)."""
    params = {key: value for key, value in {"project": project, "status": status, "kind": kind}.items() if value}
    with api_client(ctx, api_url, api_token, "cannot list runs") as client:
        rows = list(pages(client, "runs/", params, limit=limit))
    click.echo(
        table(
            ["ID", "RUN ID", "NAME", "STATUS", "KIND", "CREATED"],
            [
                [
                    str(run.get("id", "")),
                    run.get("external_id", ""),
                    run.get("name", ""),
                    run.get("status", ""),
                    run.get("kind", ""),
                    local_time(run.get("created_at")),
                ]
                for run in rows
            ],
            empty="no runs",
        )
    )


@click.command("sync")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=str))
@click.option("--project", default=None, help="project slug (default: the offline run's, else $MMT_PROJECT)")
@api_options
@click.pass_context
def sync(ctx: click.Context, directory: str, project: str | None, api_url: str | None, api_token: str | None) -> None:
    """Upload the offline run in DIRECTORY (metrics, checkpoints, final status); safe to run again."""
    config = resolve_config(ctx, api_url, api_token)
    try:
        report = sync_offline_run(directory, config, project=project)
    except MadoError as error:
        raise click.ClickException(f"{error} (nothing sent is lost: run mado sync again)") from None
    run = report.run
    click.echo(
        f"run {run['id']} ({run.get('external_id', '')}) {'created' if report.created else 'found'}: "
        f"{report.points_sent} new metric points of {report.points_total}; checkpoints uploaded "
        f"{report.checkpoints_uploaded or 'none'}, already there {report.checkpoints_present or 'none'}; "
        f"status {report.status}"
    )
    if run.get("url"):
        click.echo(run["url"])
