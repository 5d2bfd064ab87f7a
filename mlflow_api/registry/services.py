"""State changes of the MLflow model registry (docs/design/checkpoints.md#deletion; docs/api.md#model-registry).

Who may (docs/api.md#model-registry): any member of the model's Project
creates models and versions, edits descriptions and tags; Project admins
rename, delete and set or delete aliases (an alias is what serving code
loads, so moving it is an admin's decision, like deleting stored bytes). A
model not yet placed in a Project is its creator's alone. Errors are
MLflow's (``MlflowError``) or mado's (``Forbidden`` → 403).

Locks: a version made from a checkpoint locks the checkpoint's row before the
model's (``checkpoint_lock_for_use``), and so does every deletion, so a
checkpoint is never deleted while it is being registered and
``Checkpoint.registered_as`` (the fact ``checkpoints`` reads to refuse a
deletion) is always current when the transaction commits.

Audit (docs/api.md#audit): every change to an existing model, version or
alias (description, name, tags, aliases, deletion) is recorded inside its
transaction, with ``changes`` as ``{field: [before, after]}``; creating a
model or a version is not a record, and a request that changes nothing
(the same description, an alias set where it already points) records nothing.
"""

import re

from django.db import IntegrityError, transaction
from django.db.models import F

from checkpoints.models import Checkpoint
from checkpoints.services import checkpoint_lock_for_use
from mado import policy
from mado.audit import audit_record
from mado.errors import Forbidden
from mlflow_api.errors import INVALID_PARAMETER_VALUE, RESOURCE_ALREADY_EXISTS, RESOURCE_DOES_NOT_EXIST, MlflowError
from mlflow_api.models import ModelAlias, ModelVersion, RegisteredModel
from mlflow_api.registry.selectors import check_alias_name, checkpoint_logged_model, checkpoint_uri
from mlflow_api.tracking.services import MAX_TAGS, TAG_VALUE_MAX, key_values
from runs.models import LoggedModel, Project, Run

NAME_MAX = 250
_BAD_NAME = re.compile(r"[/@%#?\x00-\x1f\x7f]")
_VERSION_LIKE = re.compile(r"^[vV]\d+$")
DESCRIPTION_MAX = 5000
PROJECT_TAG = "mado.project"  # names the Project a new model is placed in (its slug or experiment id)


def _bad(message: str) -> MlflowError:
    return MlflowError(INVALID_PARAMETER_VALUE, message)


def check_model_name(name) -> str:
    """A registered model's name: 1..250 characters, no ``/ @ % # ?`` or control character (they would break
    ``models:/<name>@<alias>``); else 400."""
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX or _BAD_NAME.search(name):
        raise _bad(f"name must be 1 to {NAME_MAX} characters without '/', '@', '%', '#', '?' or control characters")
    return name


def check_alias(alias) -> str:
    """An alias to set: a well-formed name (``selectors.check_alias_name``), not ``latest`` nor ``v<number>`` (MLflow's
    rule: ``@latest`` is the newest version); else 400."""
    alias = check_alias_name(alias)
    if alias.lower() == "latest" or _VERSION_LIKE.match(alias):
        raise _bad(
            "alias must be 1 to 255 letters, digits, '_' or '-', and neither 'latest' nor 'v<number>' "
            f"(got {alias[:60]!r})"
        )
    return alias


def _description(value) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > DESCRIPTION_MAX or "\x00" in value:
        raise _bad(f"description must be a string of at most {DESCRIPTION_MAX} characters")
    return value


def require_model_role(actor, model: RegisteredModel, role: str) -> None:
    """``Forbidden`` (403) unless ``actor`` has ``role`` in the model's Project; an unplaced model: its creator."""
    if model.project_id is None:
        if model.created_by_id != actor.pk:
            raise Forbidden("This model is not yours: only its creator can change it until it has a version.")
        return
    policy.require_role(actor, model.project, role)


def _placement(actor, tags: dict) -> Project | None:
    """The Project the ``mado.project`` tag names (slug or experiment id) among the actor's, or None."""
    wanted = tags.pop(PROJECT_TAG, None)
    if not wanted:
        return None
    projects = Project.objects.visible_to(actor)
    project = projects.filter(slug=wanted).first() or (
        projects.filter(pk=int(wanted)).first() if wanted.isdigit() and len(wanted) < 19 else None
    )
    if project is None:
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"tags.{PROJECT_TAG}: no project {wanted!r} among your projects")
    policy.require_role(actor, project, policy.MEMBER)
    return project


def registered_model_create(*, actor, name, tags=None, description=None) -> RegisteredModel:
    """A new registered model ``name`` (MLflow ``registered-models/create``).

    ``tags``: MLflow's ``[{key, value}]``; the tag ``mado.project`` (a
    Project's slug or id, member or admin there) places the model in that
    Project, else its first version does. A name the caller can see already
    → RESOURCE_ALREADY_EXISTS (400; the client then adds a version); a name
    taken where the caller cannot see → 400 that names nothing.
    """
    name = check_model_name(name)
    pairs = dict(key_values(tags, "tags", MAX_TAGS, TAG_VALUE_MAX))
    project = _placement(actor, pairs)
    try:
        with transaction.atomic():
            return RegisteredModel.objects.create(
                project=project, name=name, tags=pairs, description=_description(description), created_by=actor
            )
    except IntegrityError:
        if RegisteredModel.objects.visible_to(actor).filter(name=name).exists():
            raise MlflowError(RESOURCE_ALREADY_EXISTS, f"Registered Model (name={name}) already exists.") from None
        raise _bad("this model name cannot be used: choose another") from None


def _locked_model(model: RegisteredModel) -> RegisteredModel:
    return RegisteredModel.objects.select_for_update(of=("self",)).select_related("project").get(pk=model.pk)


def _audit(actor, action: str, obj, project_id: int | None, changes: dict | None = None) -> None:
    """One audit record of a registry change; nothing when every ``changes`` value is ``[same, same]``."""
    if changes and all(before == after for before, after in changes.values()):
        return
    audit_record(actor=actor, action=action, obj=obj, project_id=project_id, changes=changes)


@transaction.atomic
def registered_model_update(*, actor, model: RegisteredModel, description) -> RegisteredModel:
    """Set the model's description (members of its Project)."""
    require_model_role(actor, model, policy.MEMBER)
    model = _locked_model(model)
    before, model.description = model.description, _description(description)
    model.save(update_fields=["description", "updated_at"])
    _audit(actor, "registered_model.update", model, model.project_id, {"description": [before, model.description]})
    return model


def registered_model_rename(*, actor, model: RegisteredModel, new_name) -> RegisteredModel:
    """Rename the model (Project admins): ``models:/<old name>…`` stops resolving. A taken name → 400."""
    require_model_role(actor, model, policy.ADMIN)
    new_name = check_model_name(new_name)
    try:
        with transaction.atomic():
            held = list(model.versions.exclude(checkpoint=None).values_list("checkpoint_id", flat=True))
            _lock_checkpoints(held)  # the checkpoints' rows before the model's, as everywhere
            model = _locked_model(model)
            before, model.name = model.name, new_name
            model.save(update_fields=["name", "updated_at"])
            _refresh_checkpoints(held)
            _audit(actor, "registered_model.rename", model, model.project_id, {"name": [before, new_name]})
    except IntegrityError:
        raise MlflowError(RESOURCE_ALREADY_EXISTS, "this model name cannot be used: choose another") from None
    return model


@transaction.atomic
def registered_model_tag_set(*, actor, model: RegisteredModel, key, value) -> None:
    """Set tag ``key`` on the model (members); ``value`` None deletes it, a no-op when it is not set (MLflow's
    answer: 200, nothing changes nor is recorded)."""
    require_model_role(actor, model, policy.MEMBER)
    model = _locked_model(model)
    before = model.tags
    model.tags = _tags_with(before, key, value)
    if model.tags != before:
        model.save(update_fields=["tags", "updated_at"])
        _audit_tag(actor, "registered_model", model, model.project_id, before, model.tags)


def _tags_with(tags: dict, key, value) -> dict:
    """``tags`` with ``key`` set to ``value`` (a checked key and value, else 400), or without it (``value`` None)."""
    ((key, text),) = key_values([{"key": key, "value": value or ""}], "tag", 1, TAG_VALUE_MAX)
    if value is not None:
        return {**tags, key: text}
    return {k: v for k, v in tags.items() if k != key}


def _audit_tag(actor, entity: str, obj, project_id: int | None, before: dict, after: dict) -> None:
    """``<entity>.set_tag`` or ``.delete_tag`` with ``{"tags.<key>": [before, after]}`` (None: no such tag)."""
    changed = {f"tags.{k}": [before.get(k), after.get(k)] for k in before.keys() | after.keys()}
    verb = "set_tag" if len(after) >= len(before) else "delete_tag"
    _audit(actor, f"{entity}.{verb}", obj, project_id, changed)


@transaction.atomic
def registered_model_delete(*, actor, model: RegisteredModel) -> None:
    """Delete the model with its versions and aliases (Project admins); their checkpoints become deletable."""
    require_model_role(actor, model, policy.ADMIN)
    checkpoint_ids = list(model.versions.exclude(checkpoint=None).values_list("checkpoint_id", flat=True))
    _lock_checkpoints(checkpoint_ids)
    _audit(actor, "registered_model.delete", model, model.project_id)
    RegisteredModel.objects.filter(pk=model.pk).delete()
    _refresh_checkpoints(checkpoint_ids)


def _lock_checkpoints(checkpoint_ids) -> None:
    list(Checkpoint.objects.select_for_update().filter(pk__in=checkpoint_ids).order_by("pk").values_list("pk"))


def _refresh_checkpoints(checkpoint_ids) -> None:
    """Write ``Checkpoint.registered_as``: the versions registered from each checkpoint (empty: none)."""
    for checkpoint_id in sorted(set(checkpoint_ids)):
        versions = ModelVersion.objects.filter(checkpoint_id=checkpoint_id).select_related("registered_model")
        label = ", ".join(f"{v.registered_model.name} v{v.version}" for v in versions.order_by("pk"))
        if len(label) > 300:
            label = label[:297] + "..."
        Checkpoint.objects.filter(pk=checkpoint_id).update(registered_as=label)


def _project_of(*, run: Run | None, logged_model: LoggedModel | None, checkpoint: Checkpoint | None):
    owners = [o.project_id for o in (run, logged_model) if o is not None]
    if checkpoint is not None:
        owners.append(checkpoint.run.project_id)
    if not owners:
        raise _bad("run_id or model_id: a model version is registered from a run or a logged model")
    if len(set(owners)) > 1:
        raise _bad("run_id and model_id name a run and a logged model of different experiments")
    return owners[0]


def model_version_create(
    *, actor, model: RegisteredModel, source, run=None, logged_model=None, checkpoint=None, tags=None, description=None
) -> ModelVersion:
    """Version ``last_version + 1`` of ``model`` (MLflow ``model-versions/create``), status READY at once.

    ``run`` / ``logged_model`` / ``checkpoint``: what it was registered from
    (at least one; all of one Project, member or admin there, else 400 /
    403). The first version of an unplaced model places it in that Project;
    a version from another Project than the model's → 400. A ``checkpoint``
    must be complete (409) and then cannot be deleted while the version
    exists; registering it into the same model again returns its version
    (a double click makes one). ``source``: the URI the client sent (at
    most 2,048 characters).
    """
    if not isinstance(source, str) or not source or len(source) > 2048:
        raise _bad("source must be a URI of at most 2048 characters")
    project_id = _project_of(run=run, logged_model=logged_model, checkpoint=checkpoint)
    pairs = dict(key_values(tags, "tags", MAX_TAGS, TAG_VALUE_MAX))
    with transaction.atomic():
        if checkpoint is not None:
            checkpoint = checkpoint_lock_for_use(checkpoint_id=checkpoint.pk)
        require_model_role(actor, model, policy.MEMBER)
        policy.require_role(actor, Project.objects.get(pk=project_id), policy.MEMBER)
        model = _locked_model(model)
        if checkpoint is not None:  # a double click: the checkpoint's row lock made the second wait for the first
            existing = model.versions.filter(checkpoint=checkpoint).order_by("version").first()
            if existing is not None:
                return existing
        if model.project_id not in (None, project_id):
            raise _bad(f"model {model.name!r} belongs to another experiment: register versions of its own runs")
        RegisteredModel.objects.filter(pk=model.pk).update(last_version=F("last_version") + 1, project_id=project_id)
        model.refresh_from_db(fields=["last_version", "project"])
        version = ModelVersion.objects.create(
            registered_model=model,
            version=model.last_version,
            source=source,
            run=run,
            logged_model=logged_model,
            checkpoint=checkpoint,
            tags=pairs,
            description=_description(description),
            created_by=actor,
        )
        if checkpoint is not None:
            _refresh_checkpoints([checkpoint.pk])
    return version


@transaction.atomic
def model_version_update(*, actor, version: ModelVersion, description) -> ModelVersion:
    """Set the version's description (members)."""
    require_model_role(actor, version.registered_model, policy.MEMBER)
    version = ModelVersion.objects.select_for_update().select_related("registered_model").get(pk=version.pk)
    before, version.description = version.description, _description(description)
    version.save(update_fields=["description", "updated_at"])
    project_id = version.registered_model.project_id
    _audit(actor, "model_version.update", version, project_id, {"description": [before, version.description]})
    return version


@transaction.atomic
def model_version_tag_set(*, actor, version: ModelVersion, key, value) -> None:
    """Set tag ``key`` on the version (members); ``value`` None deletes it, a no-op when it is not set (as on an
    MLflow server)."""
    require_model_role(actor, version.registered_model, policy.MEMBER)
    row = ModelVersion.objects.select_for_update().select_related("registered_model").get(pk=version.pk)
    before = row.tags
    row.tags = _tags_with(before, key, value)
    if row.tags != before:
        row.save(update_fields=["tags", "updated_at"])
        _audit_tag(actor, "model_version", row, row.registered_model.project_id, before, row.tags)


@transaction.atomic
def model_version_delete(*, actor, version: ModelVersion) -> None:
    """Delete the version and its aliases (Project admins); its checkpoint becomes deletable unless another version
    holds it. Deleting a deleted version → 404 (MLflow's answer)."""
    require_model_role(actor, version.registered_model, policy.ADMIN)
    _lock_checkpoints([version.checkpoint_id] if version.checkpoint_id else [])
    _audit(actor, "model_version.delete", version, version.registered_model.project_id)
    ModelVersion.objects.filter(pk=version.pk).delete()
    if version.checkpoint_id:
        _refresh_checkpoints([version.checkpoint_id])


def _alias_row(model: RegisteredModel, alias: str) -> ModelAlias | None:
    return (
        ModelAlias.objects.select_related("version", "registered_model")
        .filter(registered_model=model, alias=alias)
        .first()
    )


@transaction.atomic
def model_alias_set(*, actor, model: RegisteredModel, alias, version: ModelVersion) -> None:
    """Point ``alias`` at ``version`` of ``model`` (Project admins); setting it again moves it (idempotent).

    The model's row is locked first, so two requests setting one alias at once run one after the other.
    """
    require_model_role(actor, model, policy.ADMIN)
    alias = check_alias(alias)
    model = _locked_model(model)
    row = _alias_row(model, alias)
    before = None if row is None else row.version.version
    if row is None:
        row = ModelAlias.objects.create(registered_model=model, alias=alias, version=version)
    elif before != version.version:
        row.version = version
        row.save(update_fields=["version", "updated_at"])
    _audit(actor, "model_alias.set", row, model.project_id, {"version": [before, version.version]})


@transaction.atomic
def model_alias_delete(*, actor, model: RegisteredModel, alias, missing_ok: bool = False) -> None:
    """Remove ``alias`` (Project admins). An alias that is not set: with ``missing_ok`` (the MLflow API, as an MLflow
    server answers) nothing happens, else 404 (the model page says so)."""
    require_model_role(actor, model, policy.ADMIN)
    model = _locked_model(model)
    row = _alias_row(model, alias)
    if row is None:
        if missing_ok:
            return
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"Registered model alias {alias!r} not found.")
    _audit(actor, "model_alias.delete", row, model.project_id, {"version": [row.version.version, None]})
    row.delete()


def checkpoint_register(*, actor, checkpoint: Checkpoint, name, description: str = "") -> ModelVersion:
    """ "Register as model version" on a checkpoint's row: a new version of model ``name`` (made in the checkpoint's
    Project when no model of that name is visible) pointing at the checkpoint's verified tar, or at the logged model
    its files form (a checkpoint saved through MLflow). Members of the Project; the checkpoint must be complete (409);
    then it cannot be deleted while the version exists (docs/design/checkpoints.md#deletion)."""
    project = checkpoint.run.project
    policy.require_role(actor, project, policy.MEMBER)
    model = RegisteredModel.objects.visible_to(actor).filter(name=check_model_name(name)).first()
    if model is None:
        try:
            model = registered_model_create(
                actor=actor, name=name, tags=[{"key": PROJECT_TAG, "value": str(project.pk)}]
            )
        except MlflowError as exc:  # made meanwhile by a double click
            if exc.code != RESOURCE_ALREADY_EXISTS:
                raise
            model = RegisteredModel.objects.visible_to(actor).get(name=name)
    return model_version_create(
        actor=actor,
        model=model,
        source=checkpoint_uri(checkpoint),
        run=checkpoint.run,
        logged_model=checkpoint_logged_model(checkpoint),
        checkpoint=checkpoint,
        description=description,
    )
