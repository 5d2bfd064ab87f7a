"""Tokens ``mado login`` made for this machine, kept in ``$MMT_CONFIG_DIR/credentials.json`` (default
``~/.config/mado``), readable by the user alone (docs/api.md#tokens).

The file maps each server (by ``config.server_identity``, which callers pass as ``server``) to
``{api_url, token, token_id, name, username}`` and remembers the server logged into last, so ``MMT_API_URL``
and ``MMT_API_TOKEN`` may be left unset.
"""

import json
import os
from pathlib import Path

ENV_CONFIG_DIR = "MMT_CONFIG_DIR"
FILE_NAME = "credentials.json"


def path() -> Path:
    """Where the credentials live: ``$MMT_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/mado``, else ``~/.config/mado``."""
    folder = os.environ.get(ENV_CONFIG_DIR) or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config"), "mado"
    )
    return Path(folder) / FILE_NAME


def _read() -> dict:
    try:
        data = json.loads(path().read_text())
    except (OSError, ValueError):
        return {"servers": {}}
    return data if isinstance(data, dict) and isinstance(data.get("servers"), dict) else {"servers": {}}


def _write(data: dict) -> None:
    """Write the file whole through a temporary one made 0600 before any secret is in it."""
    target = path()
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = target.with_suffix(".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(data, handle, indent=2)
    os.replace(temporary, target)


def store(*, server: str, api_url: str, token: str, token_id: int, name: str, username: str) -> Path:
    """Keep ``token`` for ``server`` (replacing one kept before) and make it the default server; the file's path."""
    data = _read()
    entry = {"api_url": api_url, "token": token, "token_id": token_id, "name": name, "username": username}
    data["servers"][server] = entry
    data["default"] = server
    _write(data)
    return path()


def lookup(server: str | None) -> dict | None:
    """The kept entry for ``server`` (None: the server logged into last), or None."""
    data = _read()
    key = server or data.get("default")
    return data["servers"].get(key) if key else None


def forget(server: str | None) -> dict | None:
    """Remove and return the entry for ``server`` (None: the default server), or None when there was none."""
    data = _read()
    key = server or data.get("default")
    entry = data["servers"].pop(key, None) if key else None
    if entry is not None:
        if data.get("default") == key:
            data.pop("default", None)
        _write(data)
    return entry
