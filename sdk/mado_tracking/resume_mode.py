"""Which Run ``start_run`` writes to (docs/design/runs.md#resume-modes): the run id, the resume mode, ``resume="auto"``
and the start request.

Modes (``resume=`` or ``MMT_RESUME``), keyed on (project, run id) on the server:

- ``"must"``: continue the run with this id; ``ApiError`` 404 when the project has none.
- ``"allow"``: continue it when it exists, else create it under this id.
- ``"never"``: create it; ``ApiError`` 409 when the id is taken.
- ``"auto"``: resolved here: ``<cwd>/.mado/resume.json`` names the run last
  started from this directory; when it is a run of this project that did not
  finish, it is continued (``allow``), else a new run starts. Every such
  resume logs an INFO line naming the run id and the file; a parameter
  conflict then says the run came from that file (``auto_conflict``).
- None: the Run a Job pre-created under ``MMT_RUN_ID`` is attached, else a new run (as ``never``).

"Exists" means started at least once: a pre-created ``pending`` Run (a Job's,
a sweep trial's) is attached, not resumed. A run whose heartbeat is fresh is
live in another process and is refused (409 ``run_live``).

``.mado/resume.json`` is written atomically (temp file + ``os.replace``) by
every online start and removed when that run finishes cleanly.
"""

import json
import logging
import os
import re
import socket
import uuid
from pathlib import Path

from mado_tracking.client import ApiClient
from mado_tracking.config import ENV_PROJECT
from mado_tracking.errors import ApiError

logger = logging.getLogger("mado_tracking")

ENV_RUN_ID = "MMT_RUN_ID"
ENV_RESUME = "MMT_RESUME"
RESUME_MODES = ("must", "allow", "never", "auto")
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,128}")
RESUME_FILE = Path(".mado") / "resume.json"
# A retried POST that reached the server the first time meets its own Run under these answers.
_OWN_RUN_CONFLICTS = ("conflict", "run_live")


def check_run_id(run_id) -> str | None:
    """The run id from ``id=``, else ``MMT_RUN_ID`` (None when neither is set).

    Raises ``ValueError`` naming the argument and the variable when it is not
    1 to 128 characters of ``[A-Za-z0-9_.-]``.
    """
    source = "id"
    if run_id is None:
        run_id, source = os.environ.get(ENV_RUN_ID, "").strip() or None, ENV_RUN_ID
        if run_id is None:
            return None
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id):
        raise ValueError(
            f"{source} must be 1 to 128 characters of letters, digits, '_', '.' or '-' "
            f"(the run id: argument id= or variable {ENV_RUN_ID}), got {run_id!r}"
        )
    return run_id


def check_resume_mode(resume, run_id: str | None) -> str | None:
    """The resume mode from ``resume=``, else ``MMT_RESUME`` (None when neither is set).

    Raises ``ValueError`` naming the argument and the variable for an unknown
    mode, or for ``"must"`` without a run id.
    """
    source = "resume"
    if resume is None:
        resume, source = os.environ.get(ENV_RESUME, "").strip().lower() or None, ENV_RESUME
        if resume is None:
            return None
    if resume not in RESUME_MODES:
        raise ValueError(
            f"{source} must be one of {', '.join(RESUME_MODES)} (argument resume= or variable "
            f"{ENV_RESUME}), got {resume!r}"
        )
    if resume == "must" and run_id is None:
        raise ValueError(f"resume='must' ({source}) continues an existing run: pass id=... or set {ENV_RUN_ID}")
    return resume


def resume_file_path() -> Path:
    """``<cwd>/.mado/resume.json``, absolute, so a later ``chdir`` of the program does not move it."""
    return Path.cwd() / RESUME_FILE


def auto_resume_target(client: ApiClient, project: str, path: Path) -> str | None:
    """For ``resume="auto"``: the run id in ``path`` when it names an unfinished run of ``project``, else None.

    An unreadable or foreign file is ignored (a new run starts and overwrites it).
    Raises ``ApiError`` when the server cannot be asked.
    """
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("mado: ignoring %s (%s); starting a new run", path, exc)
        return None
    if not isinstance(record, dict) or record.get("project") != project:
        return None
    run_id = record.get("run_id")
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id):
        return None
    found = find_run(client, project, run_id)
    if found is None or found.get("status") in ("finished", "pending"):
        return None
    logger.info(
        "mado: resume='auto' continues run %s (%s), named by %s as the last run started from this directory",
        run_id,
        found.get("status"),
        path,
    )
    return run_id


def auto_conflict(error: ApiError, *, run_id: str, path: Path) -> ApiError:
    """The error to raise when resuming ``run_id``, picked by ``resume="auto"`` from ``path``, was refused.

    A parameter conflict (409 on ``parameters.<key>``) most likely means this
    is another experiment started in the same directory: the message says
    where the run id came from and suggests ``resume="never"`` or removing
    the file, never merging the two runs. Any other error is returned as is.
    """
    if error.status != 409 or not (error.field or "").startswith("parameters."):
        return error
    key = error.field.partition(".")[2]
    message = (
        f"resume='auto' picked run {run_id} from {path} (the last run started from this directory), but "
        f"parameter {key} differs from that run's: this looks like another experiment. Start a new run "
        f"with resume='never' (or MMT_RESUME=never), or remove {path}"
    )
    return ApiError(message, status=error.status, code=error.code, detail=message, field=error.field)


def named_refusal(error: ApiError, resume: str | None) -> ApiError:
    """The error to raise when the server refused to start the Run: a 404 on the run id or the project says it
    in the words the caller used, naming the argument and the variable (``id=`` / ``MMT_RUN_ID``, ``project=`` /
    ``MMT_PROJECT``), without the request line; any other error is returned as is."""
    if error.status != 404 or not error.detail:
        return error
    if error.field == "external_id":
        message = f"{error.detail} (id= / {ENV_RUN_ID})"
        if resume == "must" and "resume='allow'" not in error.detail:
            message += "; use resume='allow' to create it"
    elif error.field == "project":
        message = f"{error.detail} (project= / {ENV_PROJECT})"
    else:
        return error
    return ApiError(message, status=error.status, code=error.code, detail=error.detail, field=error.field)


def write_resume_file(path: Path, *, project: str, run: dict) -> None:
    """Record ``run`` as the last one started from this directory; a failure is only a warning."""
    record = {
        "project": project,
        "run_id": run.get("external_id"),
        "id": run.get("id"),
        "url": run.get("url"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        path.parent.mkdir(exist_ok=True)
        temporary.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        logger.warning(
            "mado: cannot write %s (%s); resume='auto' will not find run %s from here", path, exc, record["run_id"]
        )


def clear_resume_file(path: Path, run_id: str) -> None:
    """Remove ``path`` (and an empty ``.mado``) when it still names ``run_id``: the run finished cleanly."""
    try:
        if json.loads(path.read_text(encoding="utf-8")).get("run_id") != run_id:
            return  # another run started from this directory since
        path.unlink()
    except (OSError, ValueError, AttributeError):
        return
    try:
        path.parent.rmdir()
    except OSError:
        pass  # not empty: it holds something else


def start_body(
    *, project: str, kind: str, parameters: dict, name, run_id: str, resume: str | None, allow_param_change: bool
) -> dict:
    """The ``POST runs/`` body: the run, its resume mode (``auto`` already resolved) and this process as writer."""
    body = {
        "project": project,
        "kind": kind,
        "parameters": parameters,
        "external_id": run_id,
        "host": socket.gethostname()[:255],
        "pid": os.getpid(),
    }
    if name is not None:
        body["name"] = str(name)
    if resume is not None:
        body["resume"] = resume
    if allow_param_change:
        body["allow_param_change"] = True
    return body


def create_run(client: ApiClient, body: dict) -> dict:
    """POST runs/, retried on transient failures; a retry that finds its own Run already started returns it.

    The first attempt may have reached the server and lost its answer: the
    retry then meets the Run it made (409 ``conflict`` or ``run_live``). It is
    ours when its writer is this host and process (or, from a server that does
    not report writers, whenever it exists). Raises ``ApiError`` otherwise.
    """
    retried = False

    def note_retry():
        nonlocal retried
        retried = True

    try:
        return client.request("POST", "runs/", body=body, on_retry=note_retry)
    except ApiError as error:
        if not (retried and error.status == 409 and error.code in _OWN_RUN_CONFLICTS):
            raise
        found = find_run(client, body["project"], body["external_id"])
        if found is None or not _written_by(found, body):
            raise
        return found


def _written_by(run: dict, body: dict) -> bool:
    if "writer_pid" not in run:
        return True
    return (run.get("writer_host") or None, run.get("writer_pid")) == (body.get("host") or None, body.get("pid"))


def find_run(client: ApiClient, project: str, external_id: str) -> dict | None:
    """The Run of ``project`` whose run id is ``external_id``, or None."""
    found = client.request("GET", "runs/", params={"project": project, "external_id": external_id})
    for run in found.get("results", []):
        if run.get("external_id") == external_id:
            return run
    return None
