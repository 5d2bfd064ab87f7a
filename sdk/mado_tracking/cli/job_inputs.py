"""What ``mado job launch | resume | continue`` read from their arguments: a code version named by its id or, within
a Project, as ``NAME`` (its latest version) or ``NAME:VERSION``, and ``KEY=VALUE`` parameters."""

import json

import click

from mado_tracking.cli._common import pages
from mado_tracking.cli.code import find_code
from mado_tracking.client import ApiClient
from mado_tracking.errors import ApiError


def _not_found(detail: str, field: str) -> ApiError:
    return ApiError(detail, status=404, code="not_found", detail=detail, field=field)


def resolve_code_version(client: ApiClient, spec: str, project: str | None) -> int:
    """The id of the code version ``spec``: an id, or ``NAME`` / ``NAME:VERSION`` of a Code of ``project``.

    With ``project``, an id must be a version of one of its Codes (the Job
    would otherwise land in another Project). Raises ``ApiError`` (404
    naming ``code_version``) or ``click.BadParameter``.
    """
    if spec.isdigit():
        version_id = int(spec)
        codes = pages(client, f"projects/{project}/codes/") if project is not None else None
        if codes is not None and not any(
            version["id"] == version_id for code in codes for version in pages(client, f"codes/{code['id']}/versions/")
        ):
            raise _not_found(
                f"code version {version_id} is not a version of a Code of project {project!r}", "code_version"
            )
        return version_id
    if project is None:
        raise click.BadParameter(
            f"{spec!r} names a Code: give --project too (or the version's id)", param_hint="--code-version"
        )
    name, _, number = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if number and not number.isdigit():
        raise click.BadParameter(f"{spec!r}: use ID, NAME or NAME:VERSION", param_hint="--code-version")
    code = find_code(client, project, name)
    if code is None:
        raise _not_found(
            f"project {project!r} has no Code named {name!r} (mado code push registers one)", "code_version"
        )
    for version in pages(client, f"codes/{code['id']}/versions/"):  # highest version first
        if not number or version["version"] == int(number):
            return version["id"]
    raise _not_found(f"Code {name!r} has no version {number or '(none pushed yet)'}", "code_version")


def parse_parameters(items: tuple[str, ...]) -> dict:
    """``("lr=0.05", "name=wide")`` → ``{"lr": 0.05, "name": "wide"}``: a value that is JSON is decoded, else text."""
    parameters = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: use KEY=VALUE", param_hint="--param")
        if key in parameters:
            raise click.BadParameter(f"{key!r} is given twice", param_hint="--param")
        try:
            parameters[key] = json.loads(raw)
        except ValueError:
            parameters[key] = raw
    return parameters
