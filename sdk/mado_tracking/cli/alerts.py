"""``mado alert RUN_ID TITLE`` (docs/design/alerts.md#run-alert): an alert through the Project's rules from a shell."""

import click

from mado_tracking.cli._common import api_client, api_options


@click.command("alert")
@click.argument("run_id", type=int)
@click.argument("title")
@click.option("--text", default="", help="longer text of the alert")
@click.option("--level", type=click.Choice(["info", "warn", "error"]), default="warn", show_default=True)
@api_options
@click.pass_context
def alert(
    ctx: click.Context, run_id: int, title: str, text: str, level: str, api_url: str | None, api_token: str | None
) -> None:
    """Send an alert from run RUN_ID (its id, as `mado runs list` shows) through the Project's alert rules."""
    with api_client(ctx, api_url, api_token, f"cannot send the alert of run {run_id}") as client:
        answer = client.request(
            "POST", f"runs/{run_id}/alerts/", body={"title": title, "text": text, "level": level}, attempts=3
        )
    click.echo(f"sent through {answer['fired']} rule(s)" if answer["fired"] else "no alert rule listens to run alerts")
