"""What every ``mado`` subcommand shares: the API options, the client, error messages, tables and paging.

Exit statuses (all commands): 0 done, 1 the server refused or could not be
reached (the message names the field and the reason from the API's error
body), 2 bad usage (click); ``mado job logs --follow`` adds 3 (the Job
failed or was aborted) and 4 (still not final after ``--timeout``).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import click

from mado_tracking import config as config_module
from mado_tracking.client import ApiClient
from mado_tracking.config import ENV_API_TOKEN, ENV_API_URL
from mado_tracking.errors import ApiError, MadoError

PAGE_SIZE_MAX = 1000  # docs/api.md: ?page_size= at most 1000
EXIT_JOB_FAILED = 3
EXIT_TIMEOUT = 4


def api_options(func):
    """``--api-url`` / ``--api-token`` on a command (they may also be given to ``mado`` itself)."""
    func = click.option("--api-token", default=None, help=f"API token [env {ENV_API_TOKEN}]")(func)
    url_help = f"server root, e.g. http://127.0.0.1:8000 [env {ENV_API_URL}]"
    return click.option("--api-url", default=None, help=url_help)(func)


def project_option(required: bool = False, help_text: str = "project slug [env MMT_PROJECT]"):
    return click.option(
        "--project", envvar="MMT_PROJECT", default=None, required=required, show_envvar=False, help=help_text
    )


def resolve_config(ctx: click.Context, api_url: str | None, api_token: str | None) -> config_module.Config:
    """The server and token: the command's options, else ``mado``'s, else ``MMT_API_URL`` / ``MMT_API_TOKEN``."""
    parent = ctx.find_root().obj or {}
    try:
        return config_module.resolve(
            api_url=api_url or parent.get("api_url"),
            api_token=api_token or parent.get("api_token"),
            require_project=False,
        )
    except MadoError as error:
        raise click.ClickException(str(error)) from None


@contextmanager
def api_client(ctx: click.Context, api_url: str | None, api_token: str | None, doing: str) -> Iterator[ApiClient]:
    """An ``ApiClient`` for the command; an ``ApiError`` inside becomes a ``ClickException`` saying what failed."""
    client = ApiClient(resolve_config(ctx, api_url, api_token))
    try:
        yield client
    except ApiError as error:
        raise click.ClickException(describe(error, doing)) from None
    finally:
        client.close()


def describe(error: ApiError, doing: str) -> str:
    """``"<doing>: <detail> (field <f>; HTTP <status> <code>)"`` from the API's ``{"error", "detail", "field"}``.

    An unreachable server (no status) or a body without ``detail`` keeps the
    client's full message, which names the URL and the variable to check.
    """
    if error.status is None or not error.detail:
        return f"{doing}: {error}"
    where = f"field {error.field}; " if error.field else ""
    hint = f"; check {ENV_API_TOKEN}" if error.status == 401 else ""
    return f"{doing}: {error.detail} ({where}HTTP {error.status} {error.code or ''}".rstrip() + f"){hint}"


def pages(client: ApiClient, path: str, params: dict | None = None, limit: int | None = None) -> Iterator[dict]:
    """The items of a paginated list, following ``next``; at most ``limit`` of them (None: all)."""
    params = {**(params or {}), "page_size": min(limit or PAGE_SIZE_MAX, PAGE_SIZE_MAX)}
    seen = 0
    while path:
        page = client.request("GET", path, params=params, attempts=3)
        for item in page.get("results", []):
            if limit is not None and seen >= limit:
                return
            seen += 1
            yield item
        path, params = page.get("next"), None  # ``next`` already carries the query


def local_time(value: str | None) -> str:
    """An ISO 8601 time from the API as ``YYYY-MM-DD HH:MM:SS`` in the local time zone."""
    if not value:
        return ""
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return value


def table(header: list[str], rows: list[list[str]], empty: str) -> str:
    """Left-aligned columns two spaces apart; ``empty`` when there is no row."""
    if not rows:
        return empty
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths)).rstrip() for line in [header, *rows]
    )
