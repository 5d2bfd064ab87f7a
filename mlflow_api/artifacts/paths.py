"""Path checks and reads for the MLflow artifact proxy ("Bad input"; docs/design/interfaces.md#mlflow).

Every path the client sends (``artifacts/<path>``, ``?path=``, ``mpu/*/<path>``)
is ``<experiment_id>/<run_id>/artifacts[/<path inside the run>]``:
experiment = Project id, run = the Run's ``external_id``; or, for an MLflow 3
logged model, ``<experiment_id>/models/<model_id>/artifacts[/<path>]`` (the
model's ``artifact_uri``). ``check_path`` refuses traversal and injection
before anything is looked up or stored.
"""

import re
from dataclasses import dataclass

from checkpoints.models import Artifact
from mlflow_api.errors import INVALID_PARAMETER_VALUE, RESOURCE_DOES_NOT_EXIST, MlflowError
from runs.models import LoggedModel, Run

PATH_MAX = 2048
_ENCODED = re.compile(r"%[0-9a-fA-F]{2}")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_FORBIDDEN = frozenset("\\#?;")
MODEL_ID = re.compile(r"^m-[0-9a-f]{32}$")  # a logged model's id, as MLflow makes them


@dataclass(frozen=True)
class ArtifactTarget:
    """A parsed proxy path: the experiment (Project) id, the run's external id, the path inside the run ("" = root).

    ``model_id`` is set (and ``run_id`` empty) when the path names a logged model's files.
    """

    experiment_id: str
    run_id: str
    path: str
    model_id: str = ""


def check_path(raw) -> str:
    """``raw`` if it is a safe ``/``-separated relative path, else ``MlflowError`` 400 ``INVALID_PARAMETER_VALUE``.

    Refused: empty or longer than 2048 characters; absolute; a URI scheme
    (``file:``, ``http:``); an empty (``//``), ``.`` or ``..`` segment; a
    backslash, ``#``, ``?``, ``;``, NUL or other control character; a
    percent-encoded byte left after the server's decoding (``%2e%2e``).
    """
    if not isinstance(raw, str) or not raw:
        raise MlflowError(INVALID_PARAMETER_VALUE, "path must not be empty")
    if len(raw) > PATH_MAX:
        raise MlflowError(INVALID_PARAMETER_VALUE, f"path must be at most {PATH_MAX} characters")
    if any(ord(char) < 32 or ord(char) == 127 for char in raw):
        raise MlflowError(INVALID_PARAMETER_VALUE, "path must not contain NUL or control characters")
    if _FORBIDDEN.intersection(raw):
        raise MlflowError(INVALID_PARAMETER_VALUE, "path must not contain a backslash, '#', '?' or ';'")
    if _ENCODED.search(raw):
        raise MlflowError(INVALID_PARAMETER_VALUE, "path must not contain percent-encoded characters")
    if raw.startswith("/") or _SCHEME.match(raw):
        raise MlflowError(INVALID_PARAMETER_VALUE, "path must be relative, not absolute or a URI")
    if any(segment in ("", ".", "..") for segment in raw.split("/")):
        raise MlflowError(INVALID_PARAMETER_VALUE, "path must not contain empty, '.' or '..' segments")
    return raw


def parse_target(raw, *, allow_root: bool) -> ArtifactTarget:
    """Check ``raw`` (``check_path``) and split it; the run root (no path inside) only with ``allow_root``."""
    checked = check_path(raw)
    parts = checked.split("/", 4)
    if len(parts) >= 3 and parts[1] == "models" and MODEL_ID.match(parts[2]):
        if len(parts) < 4 or parts[3] != "artifacts":
            raise MlflowError(
                INVALID_PARAMETER_VALUE, "path must be <experiment_id>/models/<model_id>/artifacts/<path>"
            )
        inner = parts[4] if len(parts) == 5 else ""
        target = ArtifactTarget(experiment_id=parts[0], run_id="", path=inner, model_id=parts[2])
    else:
        parts = checked.split("/", 3)
        if len(parts) < 3 or parts[2] != "artifacts":
            raise MlflowError(INVALID_PARAMETER_VALUE, "path must be <experiment_id>/<run_id>/artifacts/<path>")
        target = ArtifactTarget(experiment_id=parts[0], run_id=parts[1], path=parts[3] if len(parts) == 4 else "")
    if not target.path and not allow_root:
        raise MlflowError(INVALID_PARAMETER_VALUE, "path must name a file inside the run's artifacts")
    return target


def run_for_target(*, user, target: ArtifactTarget) -> Run:
    """The Run ``target`` names in one of the user's Projects; else ``MlflowError`` 404 ``RESOURCE_DOES_NOT_EXIST``."""
    run = None
    if target.experiment_id.isdigit():
        run = (
            Run.objects.visible_to(user)
            .select_related("project")
            .filter(project_id=int(target.experiment_id), external_id=target.run_id)
            .first()
        )
    if run is None:
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, "no run at this experiment_id/run_id among your projects")
    return run


def logged_model_for_target(*, user, target: ArtifactTarget) -> LoggedModel:
    """The live (not deleted) logged model ``target`` names in one of the user's Projects; else 404."""
    model = None
    if target.experiment_id.isdigit():
        model = (
            LoggedModel.objects.visible_to(user)
            .select_related("project", "run")
            .filter(project_id=int(target.experiment_id), model_id=target.model_id, deleted_at__isnull=True)
            .first()
        )
    if model is None:
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, "no logged model at this experiment_id/model_id among your projects")
    return model


def files_of(owner: Run | LoggedModel):
    """The Artifact rows of a Run or of a logged model."""
    return (
        Artifact.objects.filter(logged_model=owner)
        if isinstance(owner, LoggedModel)
        else Artifact.objects.filter(run=owner)
    )


def artifact_for_target(*, files, target: ArtifactTarget) -> Artifact:
    """The stored file ``target.path`` among ``files`` (``files_of``); else 404 ``RESOURCE_DOES_NOT_EXIST``."""
    artifact = files.filter(path=target.path).first()
    if artifact is None:
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"artifact {target.path!r} not found")
    return artifact


def list_directory(*, files, path: str) -> list[dict]:
    """MLflow's ``files`` of directory ``path`` ("" = root) among ``files`` (``files_of``):
    ``{"path", "is_dir", "file_size"?}``.

    ``path`` of each entry is relative to the listed directory (the client
    joins it); directories have no ``file_size``. Sorted by path; empty when
    nothing is stored below ``path``.
    """
    prefix = f"{path}/" if path else ""
    sizes, dirs = {}, set()
    rows = files.filter(path__startswith=prefix).values_list("path", "size")
    for full, size in rows.iterator(chunk_size=2000):
        name, sep, _rest = full[len(prefix) :].partition("/")
        if sep:
            dirs.add(name)
        else:
            sizes[name] = size
    entries = [{"path": name, "is_dir": True} for name in dirs]
    entries += [{"path": name, "is_dir": False, "file_size": size} for name, size in sizes.items()]
    return sorted(entries, key=lambda entry: entry["path"])
