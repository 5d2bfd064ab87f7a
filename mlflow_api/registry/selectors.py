"""Reads of the MLflow model registry and its MLflow JSON shapes (docs/api.md#model-registry).

Models are looked up among the caller's (``RegisteredModel.objects.visible_to``):
an invisible one answers as a missing one, RESOURCE_DOES_NOT_EXIST (404).
"""

import re

from django.db.models import F, Prefetch, Q

from checkpoints.models import Artifact, Checkpoint, CheckpointLayout, ManifestEntry
from mlflow_api.errors import INVALID_PARAMETER_VALUE, RESOURCE_DOES_NOT_EXIST, MlflowError
from mlflow_api.models import ModelAlias, ModelVersion, RegisteredModel
from mlflow_api.tracking import search
from mlflow_api.tracking.logged_models import artifact_uri as logged_model_uri
from mlflow_api.tracking.translate import artifact_uri as run_uri
from mlflow_api.tracking.translate import decode_page_token, encode_page_token, ms
from runs.models import LoggedModel

ALIAS = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
SEARCH_DEFAULT, SEARCH_MAX = 100, 1000  # registered models, as on an MLflow server
VERSIONS_MAX = 200_000  # the client asks for 10,000 versions by default


def _bad(message: str) -> MlflowError:
    return MlflowError(INVALID_PARAMETER_VALUE, message)


def registered_model_get(*, user, name) -> RegisteredModel:
    """The registered model ``name`` among the user's; else RESOURCE_DOES_NOT_EXIST (404)."""
    model = None
    if isinstance(name, str) and name and len(name) <= 250:
        model = RegisteredModel.objects.visible_to(user).select_related("project").filter(name=name).first()
    if model is None:
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"Registered Model with name={str(name)[:250]} not found")
    return model


def version_number(version) -> int:
    """``version`` as MLflow reads it (Python's ``int``: ``"3"``, ``" 3"``, ``"+3"``); anything else →
    INVALID_PARAMETER_VALUE (400) "Parameter 'version' must be an integer", before the model is looked up."""
    try:
        return int(str(version))
    except ValueError:
        raise _bad(f"Parameter 'version' must be an integer, got '{str(version)[:60]}'.") from None


def model_version_get(*, user, name, version) -> ModelVersion:
    """Version ``version`` of the user's model ``name``: a ``version`` that is not an integer → 400 (whether the
    model exists or not, as on an MLflow server); an unknown model or version → 404."""
    number = version_number(version)
    model = registered_model_get(user=user, name=name)
    found = None
    if 0 < number < 2**31:
        found = _versions().filter(registered_model=model, version=number).first()
    if found is None:
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"Model Version (name={model.name}, version={version}) not found")
    return found


def check_alias_name(alias) -> str:
    """An alias as a name: letters, digits, ``_`` and ``-`` (1..255); else INVALID_PARAMETER_VALUE (400). Setting one
    also refuses ``latest`` and ``v<number>`` (``services.check_alias``)."""
    if not isinstance(alias, str) or not ALIAS.match(alias):
        raise _bad(
            "alias must be 1 to 255 letters, digits, '_' or '-', and neither 'latest' nor 'v<number>' "
            f"(got {str(alias)[:60]!r})"
        )
    return alias


def model_version_by_alias(*, user, name, alias) -> ModelVersion:
    """The version alias ``alias`` of the user's model ``name`` points at, as an MLflow server answers: a malformed
    alias → 400, an unknown model → 404, ``latest`` (any case) → the newest version (none: 404), an alias that is
    not set → 400 INVALID_PARAMETER_VALUE "Registered model alias … not found."."""
    alias = check_alias_name(alias)
    model = registered_model_get(user=user, name=name)
    if alias.lower() == "latest":
        newest = _versions().filter(registered_model=model).order_by("-version").first()
        if newest is None:
            raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"Latest version not found for model {model.name}.")
        return newest
    found = ModelAlias.objects.filter(registered_model=model, alias=alias).first()
    if found is None:
        raise _bad(f"Registered model alias {alias} not found.")
    return _versions().get(pk=found.version_id)


def _versions():
    return ModelVersion.objects.select_related(
        "registered_model__project", "run", "logged_model", "checkpoint__run", "created_by"
    )


def checkpoint_logged_model(checkpoint: Checkpoint) -> LoggedModel | None:
    """The logged model whose files form ``checkpoint`` (saved through MLflow), or None."""
    if checkpoint.layout != CheckpointLayout.FILES:
        return None
    files = ManifestEntry.objects.filter(checkpoint=checkpoint).values("artifact_id")
    stored = Artifact.objects.filter(pk__in=files, logged_model__isnull=False).select_related("logged_model").first()
    return stored.logged_model if stored else None


def checkpoint_uri(checkpoint: Checkpoint) -> str:
    """Where the client downloads a checkpoint: its tar, or the directory of its files, through the artifact proxy."""
    model = checkpoint_logged_model(checkpoint)
    if model is not None:
        return logged_model_uri(model)
    if checkpoint.layout == CheckpointLayout.FILES:
        return f"{run_uri(checkpoint.run)}/checkpoints/step-{checkpoint.step}"
    return f"{run_uri(checkpoint.run)}/{checkpoint.artifact_path}"


def download_uri(version: ModelVersion) -> str:
    """What ``models:/<name>/<version>`` downloads: the logged model's files, else the checkpoint's, else
    ``source``."""
    if version.logged_model is not None:
        return logged_model_uri(version.logged_model)
    if version.checkpoint is not None:
        return checkpoint_uri(version.checkpoint)
    return version.source


def _tags(tags: dict) -> list[dict]:
    return [{"key": k, "value": v} for k, v in sorted(tags.items())]


def model_version_json(version: ModelVersion, aliases: list[str] | None = None) -> dict:
    """An MLflow ``ModelVersion`` (stage always "None": mado has aliases, not stages)."""
    if aliases is None:
        aliases = [a.alias for a in version.aliases.all()]  # prefetched by the searches
    return {
        "name": version.registered_model.name,
        "version": str(version.version),
        "creation_timestamp": ms(version.created_at),
        "last_updated_timestamp": ms(version.updated_at),
        "user_id": version.created_by.get_username() if version.created_by else "",
        "current_stage": "None",
        "description": version.description,
        "source": version.source,
        "run_id": version.run.external_id if version.run else "",
        "status": "READY",
        "tags": _tags(version.tags),
        "aliases": sorted(aliases),
        **({"model_id": version.logged_model.model_id} if version.logged_model else {}),
    }


def registered_model_json(model: RegisteredModel) -> dict:
    """An MLflow ``RegisteredModel`` with its latest version and its aliases."""
    aliases = list(model.aliases.all())
    if "versions" in getattr(model, "_prefetched_objects_cache", {}):  # a search's page: no query per model
        latest = next(iter(model.versions.all()), None)
    else:
        latest = _versions().filter(registered_model=model).order_by("-version").first()
    return {
        "name": model.name,
        "creation_timestamp": ms(model.created_at),
        "last_updated_timestamp": ms(model.updated_at),
        "user_id": model.created_by.get_username() if model.created_by else "",
        "description": model.description,
        "latest_versions": [model_version_json(latest)] if latest else [],
        "tags": _tags(model.tags),
        "aliases": [{"alias": a.alias, "version": str(a.version.version)} for a in aliases],
    }


def _page(rows, *, max_results, page_token, maximum: int = SEARCH_MAX, empty_below_one: bool = False):
    """``(rows of the page, next_page_token or None)``. ``max_results``: an integer up to ``maximum``, else 400;
    below 1 also 400, or with ``empty_below_one`` (registered models, as on an MLflow server) an empty page without a
    next page."""
    size = max_results if max_results not in (None, "") else SEARCH_DEFAULT
    try:
        size = None if isinstance(size, bool) else int(str(size))
    except ValueError:
        size = None
    least = None if empty_below_one else 1
    if size is None or size > maximum or (least is not None and size < least):
        raise _bad(f"max_results must be between {least or 0} and {maximum}")
    offset = decode_page_token(page_token)
    if size < 1:
        return [], None
    page = list(rows[offset : offset + size + 1])
    return page[:size], encode_page_token(offset + size) if len(page) > size else None


_MODEL_FIELDS = {"name": "name"}
_VERSION_FIELDS = {"name": "registered_model__name", "run_id": "run__external_id", "source_path": "source"}
_ORDER = {
    "name": "name",
    "timestamp": "updated_at",
    "last_updated_timestamp": "updated_at",
    "version_number": "version",
}


def _filtered(rows, filter_string, fields: dict):
    for index, entity, key, op, raw in search.clauses(filter_string or ""):
        kind = (entity or "attributes").lower()
        if op not in search.STRING_OPS:
            raise _bad(f"{key!r} compares with =, !=, LIKE, ILIKE; got {op}")
        if kind.startswith("tag"):
            rows = rows.annotate(**{f"_t{index}": search.json_text("tags", key)})
            wanted = search.string_q(f"_t{index}", op, search.string_value(raw))
            # A model without the tag is not equal to any value: the client excludes prompts with
            # tags.`mlflow.prompt.is_prompt` != 'true' on every search.
            missing = Q(**{f"_t{index}__isnull": True}) if op == "!=" or op.startswith("not") else Q(pk__in=[])
            rows = rows.filter(wanted | missing)
        elif kind.startswith("attr") and key in fields:
            rows = rows.filter(search.string_q(fields[key], op, search.string_value(raw)))
        else:
            raise _bad(f"unsupported filter on {key!r}: use {', '.join(fields)} or tags.<key>")
    return rows


def _ordered(rows, order_by, default):
    ordering = []
    for clause in order_by or []:
        field, _, direction = str(clause).strip().partition(" ")
        column = _ORDER.get(field.removeprefix("attributes.").lower())
        if column is None or column not in {f.name for f in rows.model._meta.fields} | {"name"}:
            raise _bad(f"Invalid order_by clause {str(clause)[:80]!r}")
        column = "registered_model__name" if column == "name" and rows.model is ModelVersion else column
        ordering.append(F(column).desc() if direction.strip().upper() == "DESC" else F(column).asc())
    return rows.order_by(*ordering, *default)


def registered_model_search(*, user, filter_string="", order_by=None, max_results=None, page_token=None):
    """A page of the user's models; filter on ``name`` and ``tags.<key>`` (=, !=, LIKE, ILIKE) joined by AND;
    ``order_by`` ``["name ASC", "last_updated_timestamp DESC"]``; ``(models, next_page_token or None)``."""
    rows = _filtered(RegisteredModel.objects.visible_to(user), filter_string, _MODEL_FIELDS)
    rows = rows.select_related("created_by").prefetch_related(
        Prefetch("versions", queryset=_versions().prefetch_related("aliases").order_by("-version")),
        Prefetch("aliases", queryset=ModelAlias.objects.select_related("version")),
    )
    return _page(
        _ordered(rows, order_by, ["name"]), max_results=max_results, page_token=page_token, empty_below_one=True
    )


def model_version_search(*, user, filter_string="", order_by=None, max_results=None, page_token=None):
    """A page of versions of the user's models; filter on ``name``, ``run_id``, ``source_path`` and ``tags.<key>``;
    newest first by default."""
    visible = RegisteredModel.objects.visible_to(user).values("pk")
    rows = _filtered(_versions().filter(registered_model__in=visible), filter_string, _VERSION_FIELDS)
    rows = rows.prefetch_related("aliases")
    return _page(
        _ordered(rows, order_by, ["registered_model__name", "-version"]),
        max_results=max_results,
        page_token=page_token,
        maximum=VERSIONS_MAX,
    )


STAGES = ("none", "staging", "production", "archived")  # MLflow's stage names (any case)


def latest_versions(*, model: RegisteredModel, stages) -> list[ModelVersion]:
    """MLflow's latest version per stage: every version is in stage "None", so the newest one (none when ``stages``
    names only other stages); a name that is not one of MLflow's stages → 400, as on an MLflow server."""
    unknown = [str(stage) for stage in stages or [] if str(stage).lower() not in STAGES]
    if unknown:
        raise _bad(
            f"Invalid Model Version stage: {unknown[0][:60]}. Value must be one of None, Staging, Production, Archived."
        )
    if stages and not any(str(stage).lower() == "none" for stage in stages):
        return []
    latest = _versions().filter(registered_model=model).order_by("-version").first()
    return [latest] if latest else []


def registered_model_list_for_project(*, project, pks=None) -> list[RegisteredModel]:
    """The Project's models (only ``pks`` when given) for the registry pages, with their versions (newest first, each
    with its aliases, source Run, logged model and checkpoint) and aliases prefetched."""
    versions = _versions().prefetch_related("aliases").order_by("-version")
    rows = RegisteredModel.objects.filter(project=project)
    if pks is not None:
        rows = rows.filter(pk__in=pks)
    return list(
        rows.select_related("created_by").prefetch_related(Prefetch("versions", queryset=versions), "aliases__version")
    )
