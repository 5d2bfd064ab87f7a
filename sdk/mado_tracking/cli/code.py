"""``mado code push DIR``: register a folder as a new version of a Code (docs/api.md "Codes").

The folder is packed as a ``tar.gz`` into a temporary file (regular files
and directories only, ``__pycache__``/VCS folders and ``*.pyc`` left out; a
symbolic link or any other special file is refused before anything is sent,
since the worker would refuse it too), then streamed to
``POST codes/{id}/versions/`` as ``multipart/form-data`` with a
``Content-Length``: the archive is never held in memory. The Code is
created in the Project when no Code has that name.
"""

import json
import os
import shlex
import stat
import tarfile
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import click
import requests

from mado_tracking.cli._common import api_client, api_options, pages, project_option
from mado_tracking.client import CONNECT_TIMEOUT_S, ApiClient
from mado_tracking.errors import ApiError

SKIPPED_DIRS = frozenset({"__pycache__", ".git", ".hg", ".svn", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
SKIPPED_SUFFIXES = (".pyc", ".pyo")
UPLOAD_READ_TIMEOUT_S = 600.0  # the server stores and hashes the last bytes before it answers
_CHUNK = 1 << 20


class PackError(click.ClickException):
    """The folder cannot be packed (a link, a special file, nothing to pack); nothing was sent."""


def _members(root: Path) -> Iterator[tuple[Path, str]]:
    """``(path, archive name)`` of every directory and regular file below ``root``, parents first, sorted."""
    for current, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        base = Path(current)
        for name in [*dirs, *sorted(files)]:
            path = base / name
            rel = path.relative_to(root).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise PackError(
                    f"{path}: symbolic links cannot be pushed (the worker refuses them); copy the target in"
                )
            if stat.S_ISDIR(mode):
                yield path, rel
            elif stat.S_ISREG(mode):
                if not name.endswith(SKIPPED_SUFFIXES):
                    yield path, rel
            else:
                raise PackError(f"{path}: not a regular file or directory")


def pack_directory(root: Path, dest) -> int:
    """Write ``root``'s tree as a gzip tar to the binary file ``dest``; return the number of files.

    Owners are dropped (uid/gid 0, no names); modes and times are kept.
    Raises ``PackError`` for a link, a special file, or a folder with no file.
    """
    files = 0

    def anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(fileobj=dest, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for path, rel in _members(root):
            tar.add(path, arcname=rel, recursive=False, filter=anonymous)
            files += path.is_file()
    if not files:
        raise PackError(f"{root}: no file to push")
    return files


class MultipartBody:
    """A ``multipart/form-data`` body of text ``fields`` and one file, streamed in 1 MiB chunks.

    ``requests`` sends an iterable with a ``len()`` with a ``Content-Length``
    and without reading it into memory first.
    """

    def __init__(self, fields: dict[str, str], file_field: str, filename: str, fileobj, size: int):
        self.boundary = uuid.uuid4().hex
        parts = [
            f'--{self.boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
            for name, value in fields.items()
        ]
        parts.append(
            f'--{self.boundary}\r\nContent-Disposition: form-data; name="{file_field}"; '
            f'filename="{filename}"\r\nContent-Type: application/gzip\r\n\r\n'.encode()
        )
        self.head = b"".join(parts)
        self.tail = f"\r\n--{self.boundary}--\r\n".encode()
        self.fileobj = fileobj
        self.size = size

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    def __len__(self) -> int:
        return len(self.head) + self.size + len(self.tail)

    def __iter__(self) -> Iterator[bytes]:
        yield self.head
        self.fileobj.seek(0)
        while chunk := self.fileobj.read(_CHUNK):
            yield chunk
        yield self.tail


def find_code(client: ApiClient, project: str, name: str) -> dict | None:
    """The Project's Code called ``name`` (``{id, name, created_at}``), or None."""
    return next((code for code in pages(client, f"projects/{project}/codes/") if code.get("name") == name), None)


def code_get_or_create(client: ApiClient, project: str, name: str) -> tuple[dict, bool]:
    """``(code, created)``: the Code called ``name``, registered first when the Project has none."""
    code = find_code(client, project, name)
    if code is not None:
        return code, False
    try:
        return client.request("POST", f"projects/{project}/codes/", body={"name": name}, attempts=1), True
    except ApiError as error:
        if error.status != 409:
            raise
    code = find_code(client, project, name)  # someone registered it meanwhile
    if code is None:
        raise ApiError(f"code {name!r} is taken but not listed", status=409, detail=f"code {name!r} not found")
    return code, False


def upload_version(client: ApiClient, code_id: int, entrypoint: list[str], archive, size: int) -> dict:
    """``POST codes/{id}/versions/``: one attempt (a retry could add a second version); the version resource."""
    path = f"codes/{code_id}/versions/"
    body = MultipartBody({"entrypoint": json.dumps(entrypoint)}, "archive", "code.tar.gz", archive, size)
    try:
        response = client.session.post(
            client.url(path),
            data=body,
            headers={"Content-Type": body.content_type},
            timeout=(CONNECT_TIMEOUT_S, UPLOAD_READ_TIMEOUT_S),
        )
    except requests.RequestException as exc:
        raise ApiError(
            f"cannot reach the mado API at {client.config.api_url} ({type(exc).__name__}: {exc}); "
            "the version was probably not added: push again"
        ) from None
    if response.status_code >= 400:
        raise client.error_from(response, "POST", path)
    return client.decode(response, "POST", path)


def parse_entrypoint(text: str) -> list[str]:
    """The argv of a shell-like command line (``shlex``: quotes group, no variables, no pipes)."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise click.BadParameter(f"cannot be split into arguments: {exc}", param_hint="--entrypoint") from None
    if not argv:
        raise click.BadParameter("is empty; e.g. --entrypoint 'python train.py --steps 100'", param_hint="--entrypoint")
    return argv


@click.group()
def code() -> None:
    """Training programs (Codes) and their versions."""


@code.command("push")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@project_option(required=True)
@click.option("--name", required=True, help="the Code's name in the Project (registered when new)")
@click.option(
    "--entrypoint",
    required=True,
    metavar="COMMAND",
    help='command run in the unpacked folder, e.g. "python train.py --steps 100" (split like a shell, '
    "no shell features)",
)
@click.option("--quiet", "-q", is_flag=True, help="print only the new code version's id")
@api_options
@click.pass_context
def code_push(
    ctx: click.Context,
    directory: Path,
    project: str,
    name: str,
    entrypoint: str,
    quiet: bool,
    api_url: str | None,
    api_token: str | None,
) -> None:
    """Pack DIRECTORY (tar.gz) and register it as the next version of Code NAME; print the version's id.

    Launch it with ``mado job launch --code-version ID``.
    """
    argv = parse_entrypoint(entrypoint)
    root = directory.resolve()
    with tempfile.TemporaryFile(prefix="mado-code-") as archive:
        files = pack_directory(root, archive)
        size = archive.tell()
        with api_client(ctx, api_url, api_token, f"cannot push {directory} as code {name!r}") as client:
            code_row, created = code_get_or_create(client, project, name)
            version = upload_version(client, code_row["id"], argv, archive, size)
    if quiet:
        click.echo(version["id"])
        return
    click.echo(
        f"code version {version['id']}: {name} v{version['version']} (code {code_row['id']}"
        f"{', new' if created else ''}) in project {project}"
    )
    click.echo(
        f"  archive: {files} file{'s' if files != 1 else ''}, {version.get('archive_size') or size} bytes, "
        f"sha256 {version.get('archive_sha256') or '?'}"
    )
    click.echo(f"  entrypoint: {shlex.join(version.get('entrypoint') or argv)}")
