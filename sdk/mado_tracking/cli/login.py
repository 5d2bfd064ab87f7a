"""``mado login`` / ``mado logout``: make an API token for this machine with the user's password and keep it
(``mado_tracking.credentials``), or revoke and forget it (docs/api.md#tokens)."""

import os
import socket
from datetime import datetime

import click
import requests

from mado_tracking import credentials
from mado_tracking.config import ENV_API_URL, normalize_api_url, server_identity
from mado_tracking.errors import ConfigError

TIMEOUT_S = 30


def _server(ctx: click.Context, api_url: str | None) -> str:
    """The server: ``--api-url`` (on the command or on ``mado``), else ``MMT_API_URL``, else the last logged into."""
    url = api_url or (ctx.find_root().obj or {}).get("api_url") or os.environ.get(ENV_API_URL, "").strip()
    if not url:
        kept = credentials.lookup(None)
        if kept is None:
            raise click.ClickException(f"which server? pass --api-url or set {ENV_API_URL}")
        url = kept["api_url"]
    try:
        return normalize_api_url(url)
    except ConfigError as error:
        raise click.ClickException(str(error)) from None


def _refusal(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}"
    field = f" ({body['field']})" if body.get("field") else ""
    return f"HTTP {response.status_code}: {body.get('detail', body)}{field}"


@click.command()
@click.option("--api-url", default=None, help=f"server root, e.g. https://mado.example.com [env {ENV_API_URL}]")
@click.option("--username", prompt=True, help="your mado user name")
@click.option("--password", prompt=True, hide_input=True, help="your password (asked when not given)")
@click.option("--name", default=None, help="the token's name (default: this machine's name and the time)")
@click.option("--scope", type=click.Choice(["read", "write", "admin"]), default="write", show_default=True)
@click.option("--days", type=int, default=None, help="lifetime in days (default: the server's)")
@click.pass_context
def login(ctx, api_url, username, password, name, scope, days):
    """Make an API token for this machine and keep it, so commands and the SDK need no MMT_API_TOKEN."""
    server = _server(ctx, api_url)
    name = name or f"mado login on {socket.gethostname()} {datetime.now():%Y-%m-%d %H:%M:%S}"
    body = {"name": name, "scope": scope, **({"expires_in_days": days} if days else {})}
    response = requests.post(f"{server}/api/v1/tokens/", json=body, auth=(username, password), timeout=TIMEOUT_S)
    if response.status_code != 201:
        raise click.ClickException(f"could not log in to {server}: {_refusal(response)}")
    made = response.json()
    where = credentials.store(
        server=server_identity(server),
        api_url=server,
        token=made["key"],
        token_id=made["id"],
        name=name,
        username=username,
    )
    click.echo(f"logged in to {server} as {username}: token “{name}” ({scope}, expires {made['expires_at']})")
    click.echo(f"kept in {where}")


@click.command()
@click.option("--api-url", default=None, help=f"server root [env {ENV_API_URL}; default: the last one logged into]")
@click.pass_context
def logout(ctx, api_url):
    """Revoke the token ``mado login`` made for this machine and forget it."""
    kept = credentials.lookup(server_identity(api_url) if api_url else None)
    if kept is None:
        raise click.ClickException("not logged in there: nothing to forget")
    response = requests.delete(
        f"{kept['api_url']}/api/v1/tokens/{kept['token_id']}/",
        headers={"Authorization": f"Bearer {kept['token']}"},
        timeout=TIMEOUT_S,
    )
    credentials.forget(server_identity(kept["api_url"]))
    if response.status_code not in (204, 401):  # 401: already revoked or expired
        raise click.ClickException(f"forgot the token, but the server did not revoke it: {_refusal(response)}")
    click.echo(f"logged out of {kept['api_url']}: token “{kept['name']}” revoked")
