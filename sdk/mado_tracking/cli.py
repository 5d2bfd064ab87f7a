"""The ``mado`` command line (SPEC F18, F29): ``mado --version``, ``mado runs list``, ``mado sync DIR``.

Configuration as in the SDK: ``--api-url`` / ``--api-token`` (on ``mado`` or
on the command), else ``MMT_API_URL`` / ``MMT_API_TOKEN``; ``--project``
defaults to ``MMT_PROJECT``.
"""

from datetime import datetime

import click

from mado_tracking import config as config_module
from mado_tracking._version import __version__
from mado_tracking.client import ApiClient
from mado_tracking.errors import MadoError
from mado_tracking.run import RUN_KINDS
from mado_tracking.sync import sync_offline_run

RUN_STATUSES = ("pending", "running", "finished", "failed", "aborted", "crashed", "preempting", "preempted")
PAGE_SIZE_MAX = 1000  # docs/api.md: ?page_size= at most 1000


def _api_options(func):
    func = click.option("--api-token", default=None, help="API token [env MMT_API_TOKEN]")(func)
    url_help = "server root, e.g. http://127.0.0.1:8000 [env MMT_API_URL]"
    return click.option("--api-url", default=None, help=url_help)(func)


def _config(ctx: click.Context, api_url: str | None, api_token: str | None,
            project: str | None = None) -> config_module.Config:
    parent = ctx.find_root().obj or {}
    try:
        return config_module.resolve(api_url=api_url or parent.get("api_url"),
                                     api_token=api_token or parent.get("api_token"), project=project,
                                     require_project=False)
    except MadoError as error:
        raise click.ClickException(str(error)) from None


def _client(ctx: click.Context, api_url: str | None, api_token: str | None) -> ApiClient:
    return ApiClient(_config(ctx, api_url, api_token))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="mado", message="%(prog)s %(version)s")
@_api_options
@click.pass_context
def main(ctx: click.Context, api_url: str | None, api_token: str | None) -> None:
    """mado: experiment tracking and training jobs built around the checkpoint."""
    ctx.obj = {"api_url": api_url, "api_token": api_token}


@main.group()
def runs() -> None:
    """Runs of your Projects."""


@runs.command("list")
@click.option("--project", envvar="MMT_PROJECT", default=None, help="project slug [env MMT_PROJECT]")
@click.option("--status", type=click.Choice(RUN_STATUSES), default=None, help="only runs in this state")
@click.option("--kind", type=click.Choice(RUN_KINDS), default=None, help="only runs of this kind")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="at most this many runs")
@_api_options
@click.pass_context
def runs_list(ctx: click.Context, project: str | None, status: str | None, kind: str | None, limit: int,
              api_url: str | None, api_token: str | None) -> None:
    """List runs, newest first: id, run id, name, status, kind, created (local time)."""
    client = _client(ctx, api_url, api_token)
    params = {key: value for key, value in
              {"project": project, "status": status, "kind": kind, "page_size": min(limit, PAGE_SIZE_MAX)}.items()
              if value}
    rows = []
    path = "runs/"
    try:
        while path and len(rows) < limit:
            page = client.request("GET", path, params=params, attempts=3)
            rows.extend(page.get("results", []))
            path, params = page.get("next"), None  # ``next`` already carries the query
    except MadoError as error:
        raise click.ClickException(str(error)) from None
    finally:
        client.close()
    click.echo(_table(["ID", "RUN ID", "NAME", "STATUS", "KIND", "CREATED"],
                      [[str(run.get("id", "")), run.get("external_id", ""), run.get("name", ""),
                        run.get("status", ""), run.get("kind", ""), _local_time(run.get("created_at"))]
                       for run in rows[:limit]]))


@main.command("sync")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=str))
@click.option("--project", default=None, help="project slug (default: the offline run's, else $MMT_PROJECT)")
@_api_options
@click.pass_context
def sync(ctx: click.Context, directory: str, project: str | None, api_url: str | None,
         api_token: str | None) -> None:
    """Upload the offline run in DIRECTORY (metrics, checkpoints, final status); safe to run again."""
    config = _config(ctx, api_url, api_token)
    try:
        report = sync_offline_run(directory, config, project=project)
    except MadoError as error:
        raise click.ClickException(f"{error} (nothing sent is lost: run mado sync again)") from None
    run = report.run
    click.echo(f"run {run['id']} ({run.get('external_id', '')}) {'created' if report.created else 'found'}: "
               f"{report.points_sent} new metric points of {report.points_total}; checkpoints uploaded "
               f"{report.checkpoints_uploaded or 'none'}, already there {report.checkpoints_present or 'none'}; "
               f"status {report.status}")
    if run.get("url"):
        click.echo(run["url"])


def _local_time(value: str | None) -> str:
    if not value:
        return ""
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return value


def _table(header: list[str], rows: list[list[str]]) -> str:
    if not rows:
        return "no runs"
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(line, widths)).rstrip()
             for line in [header, *rows]]
    return "\n".join(lines)
