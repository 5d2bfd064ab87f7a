"""State changes for Projects, members, Code, Datasets and Runs (docs/design/house.md#where-logic-goes).

Every function takes keyword-only arguments, checks the actor through
``mado.policy`` and raises ``mado.errors`` user errors: ``ValidationFailed``
(400, naming the field), ``Forbidden`` (403), ``Conflict`` (409).
"""

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import F, Max
from django.utils import timezone
from django.utils.text import slugify
from django.utils.translation import gettext as _

from mado import policy
from mado.audit import audit_record
from mado.errors import Conflict, Forbidden, NotFound, ValidationFailed
from runs.lease import lease_check
from runs.liveness import run_ended_effects
from runs.models import (
    FINAL_STATES,
    Code,
    CodeVersion,
    Dataset,
    DatasetVersion,
    Membership,
    Project,
    Role,
    Run,
    RunKind,
    RunStatus,
    RunTableColumns,
    ServiceAccount,
)
from runs.stages import data_stage_record  # noqa: F401 - a service of this app
from runs.table import parse_columns


def require(allowed: bool, reason: str) -> None:
    """Raise ``Forbidden`` with ``reason`` unless ``allowed``."""
    if not allowed:
        raise Forbidden(reason)


@transaction.atomic
def project_create(*, user, name: str, slug: str | None = None) -> Project:
    """Create a Project; its creator becomes admin.

    ``slug`` defaults to ``slugify(name)``. Raises ``Forbidden`` for a service
    account or a ``read`` token (``policy.why_cannot_create_project``), ``ValidationFailed`` for an
    empty name or slug, ``Conflict`` "this slug is not available" when it is taken (database unique; the
    answer names no Project, docs/design/runs.md#write-rule).
    """
    refusal = policy.why_cannot_create_project(user)
    if refusal:
        raise Forbidden(refusal)
    name = (name or "").strip()
    if not name:
        raise ValidationFailed(_("name must not be empty"), field="name")
    slug_max = Project._meta.get_field("slug").max_length
    if slug and len(slugify(slug)) > slug_max:
        raise ValidationFailed(_("slug must be at most %(max)s characters") % {"max": slug_max}, field="slug")
    # A slug derived from a long name is cut to fit the column (PostgreSQL would refuse it).
    slug = slugify(slug or name)[:slug_max].strip("-")
    if not slug:
        raise ValidationFailed(_("slug must contain letters or digits"), field="slug")
    try:
        with transaction.atomic():
            project = Project.objects.create(name=name, slug=slug)
    except IntegrityError:
        # Names nothing: whoever cannot see the Project learns only that the slug cannot be used
        # (docs/design/runs.md#write-rule).
        raise Conflict(_("this slug is not available: choose another"), field="slug") from None
    Membership.objects.create(user=user, project=project, role=Role.ADMIN)
    audit_record(
        actor=user, action="project.create", obj=project, project_id=project.pk, changes={"slug": [None, slug]}
    )
    return project


def _check_role(role: str) -> None:
    if role not in Role.values:
        raise ValidationFailed(_("role must be one of %(choices)s") % {"choices": ", ".join(Role.values)}, field="role")


def guard_last_admin(project: Project, membership: Membership) -> None:
    """Refuse to leave a Project without an admin (the row lock makes two demotions serialize)."""
    admins = list(project.memberships.select_for_update().filter(role=Role.ADMIN).values_list("pk", flat=True))
    if admins == [membership.pk]:
        raise Conflict(_("a project must keep at least one admin"), field="role")


@transaction.atomic
def membership_add(*, actor, project: Project, username: str, role: str) -> Membership:
    """Add ``username`` to ``project`` with ``role`` (admin only; the members page).

    Raises ``Forbidden`` for a non-admin actor, ``ValidationFailed`` for an
    unknown user or role or another Project's service account (docs/api.md#service-accounts), ``Conflict`` when
    already a member.
    """
    require(policy.can_manage_members(actor, project), "Only project admins can manage members.")
    _check_role(role)
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise ValidationFailed(_("no user named '%(username)s'") % {"username": username}, field="username")
    if ServiceAccount.objects.filter(user=user).exclude(project=project).exists():
        raise ValidationFailed(_("A service account acts in its own project only."), field="username")
    try:
        with transaction.atomic():
            membership = Membership.objects.create(user=user, project=project, role=role)
    except IntegrityError:
        raise Conflict(
            _("%(username)s is already a member of %(project)s") % {"username": username, "project": project.slug},
            field="username",
        ) from None
    _audit_membership(actor, "membership.add", membership, {"role": [None, role]})
    return membership


def _audit_membership(actor, action: str, membership: Membership, changes: dict) -> None:
    audit_record(
        actor=actor,
        action=action,
        obj=membership,
        object_repr=f"{membership.user.get_username()} in {membership.project.slug}",
        project_id=membership.project_id,
        changes=changes,
    )


def _membership(project: Project, username: str) -> Membership:
    membership = project.memberships.select_for_update().select_related("user").filter(user__username=username).first()
    if membership is None:
        raise NotFound(
            _("'%(username)s' is not a member of %(project)s") % {"username": username, "project": project.slug},
            field="username",
        )
    return membership


@transaction.atomic
def membership_change_role(*, actor, project: Project, username: str, role: str) -> Membership:
    """Change a member's role (admin only); the last admin cannot be demoted (``Conflict``)."""
    require(policy.can_manage_members(actor, project), "Only project admins can manage members.")
    _check_role(role)
    membership = _membership(project, username)
    if membership.role == Role.ADMIN and role != Role.ADMIN:
        guard_last_admin(project, membership)
    before, membership.role = membership.role, role
    membership.save(update_fields=["role"])
    if before != role:
        _audit_membership(actor, "membership.change_role", membership, {"role": [before, role]})
    return membership


@transaction.atomic
def membership_remove(*, actor, project: Project, username: str) -> None:
    """Remove a member (admin only); the last admin cannot be removed (``Conflict``)."""
    require(policy.can_manage_members(actor, project), "Only project admins can manage members.")
    membership = _membership(project, username)
    if membership.role == Role.ADMIN:
        guard_last_admin(project, membership)
    _audit_membership(actor, "membership.remove", membership, {"role": [membership.role, None]})
    membership.delete()


def _create_unique(model, field: str, message: str, **values):
    try:
        with transaction.atomic():
            return model.objects.create(**values)
    except IntegrityError:
        raise Conflict(message, field=field) from None


def code_create(*, actor, project: Project, name: str) -> Code:
    """Register a training program in ``project`` (member or admin). ``Conflict`` on a duplicate name."""
    policy.require_role(actor, project, policy.MEMBER)
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("name must not be empty", field="name")
    return _create_unique(Code, "name", f"code {name!r} already exists", project=project, name=name, created_by=actor)


def _validate_entrypoint(entrypoint) -> list[str]:
    if not isinstance(entrypoint, list) or not entrypoint or not all(isinstance(a, str) and a for a in entrypoint):
        raise ValidationFailed("entrypoint must be a non-empty list of non-empty strings (argv)", field="entrypoint")
    return entrypoint


@transaction.atomic
def code_version_create(*, actor, code: Code, entrypoint: list[str], archive=None) -> CodeVersion:
    """Add the next version of ``code`` (numbered 1, 2, …) with its argv and optional source archive.

    ``archive`` is an ``Artifact`` already stored (``checkpoints.storage``).
    The Code row is locked so two concurrent uploads get distinct numbers.
    """
    policy.require_role(actor, code.project, policy.MEMBER)
    entrypoint = _validate_entrypoint(entrypoint)
    Code.objects.select_for_update().filter(pk=code.pk).first()
    latest = code.versions.aggregate(n=Max("version"))["n"] or 0
    return CodeVersion.objects.create(
        code=code, version=latest + 1, entrypoint=entrypoint, archive=archive, created_by=actor
    )


def dataset_create(*, actor, project: Project, name: str) -> Dataset:
    """Register a Dataset in ``project`` (member or admin). ``Conflict`` on a duplicate name."""
    policy.require_role(actor, project, policy.MEMBER)
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("name must not be empty", field="name")
    return _create_unique(Dataset, "name", f"dataset {name!r} already exists", project=project, name=name)


def dataset_version_create(
    *, actor, dataset: Dataset, version: str, uri: str = "", description: str = ""
) -> DatasetVersion:
    """Add a version label to ``dataset``. ``Conflict`` when the label exists."""
    policy.require_role(actor, dataset.project, policy.MEMBER)
    version = (version or "").strip()
    if not version:
        raise ValidationFailed("version must not be empty", field="version")
    return _create_unique(
        DatasetVersion,
        "version",
        f"version {version!r} of {dataset.name} already exists",
        dataset=dataset,
        version=version,
        uri=uri or "",
        description=description or "",
    )


def _project_objects(model, project: Project, ids, field: str, path: str):
    ids = list(ids or [])
    try:
        ids = [int(i) for i in ids]
    except (TypeError, ValueError):
        raise ValidationFailed(f"{field} must be a list of integer ids", field=field) from None
    found = {obj.pk: obj for obj in model.objects.filter(pk__in=ids, **{path: project})}
    missing = [i for i in ids if i not in found]
    if missing:
        raise ValidationFailed(f"unknown ids in this project: {missing}", field=field)
    return [found[i] for i in ids]


@transaction.atomic
def run_create(
    *,
    actor,
    project: Project,
    name: str = "",
    kind: str = RunKind.TRAINING,
    parameters: dict | None = None,
    input_dataset_version_ids: list[int] | None = None,
    code_version_id: int | None = None,
    parent_id: int | None = None,
    external_id: str | None = None,
    status: str = RunStatus.RUNNING,
) -> Run:
    """Create a Run in ``project`` (member or admin), started now when ``status`` is running.

    ``parameters`` is a JSON object; dataset versions, code version and parent
    must belong to ``project`` (else ``ValidationFailed`` naming the field).
    ``external_id`` (the run id) is unique per Project: ``Conflict`` when taken.
    The input dataset versions are the Run's initial configuration (never overwritten).
    """
    policy.require_role(actor, project, policy.MEMBER)
    if kind not in RunKind.values:
        raise ValidationFailed(f"kind must be one of {', '.join(RunKind.values)}", field="kind")
    if status not in (RunStatus.PENDING, RunStatus.RUNNING):
        raise ValidationFailed("a new run starts as pending or running", field="status")
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, dict):
        raise ValidationFailed("parameters must be a JSON object", field="parameters")
    versions = _project_objects(
        DatasetVersion, project, input_dataset_version_ids, "input_dataset_version_ids", "dataset__project"
    )
    code_version = None
    if code_version_id is not None:
        code_version = _project_objects(CodeVersion, project, [code_version_id], "code_version_id", "code__project")[0]
    parent = _project_objects(Run, project, [parent_id], "parent_id", "project")[0] if parent_id is not None else None
    values = dict(
        project=project,
        name=(name or "").strip()[:200],
        kind=kind,
        status=status,
        created_by=actor,
        parameters=parameters,
        code_version=code_version,
        parent=parent,
        started_at=timezone.now() if status == RunStatus.RUNNING else None,
    )
    if external_id:
        values["external_id"] = str(external_id)[:128]
    run = _create_unique(Run, "external_id", f"run id {external_id!r} already exists in {project.slug}", **values)
    run.input_dataset_versions.set(versions)
    return run


def run_attach(
    *,
    actor,
    project: Project,
    external_id: str,
    host: str = "",
    pid: int | None = None,
    name: str = "",
    parameters: dict | None = None,
) -> Run | None:
    """Start the pre-created Run ``external_id`` of ``project`` for its creator; the Run, or None.

    A Job's or sweep trial's Run is created ``pending`` (never started) and
    its code's SDK sends ``POST runs/`` with that external id
    (``MMT_RUN_ID``; ``runs.resume.run_start`` decides): when the Run is
    pending and was created by ``actor``, one conditional UPDATE makes it
    ``running`` (``started_at``, ``heartbeat_at`` now) and takes its write
    lease (``lease_token`` + 1, writer ``host`` / ``pid`` since now;
    docs/design/runs.md#one-writer-process). What the code passes to ``start_run`` fills what the Job left
    open, never overwriting its initial configuration: ``name`` (≤ 200
    characters) when the Run has none, ``parameters`` keys the Run does not
    hold (the Job's values win). None otherwise (absent, another creator,
    already started or ended), so two processes attaching at once start it
    once. Member or admin only (``Forbidden``); ``ValidationFailed`` naming
    ``name`` or ``parameters`` for a name too long or parameters not a JSON object.
    """
    policy.require_role(actor, project, policy.MEMBER)
    if not external_id:
        return None
    if len(name or "") > 200:
        raise ValidationFailed("at most 200 characters", field="name")
    if parameters is not None and not isinstance(parameters, dict):
        raise ValidationFailed("parameters must be a JSON object", field="parameters")
    now = timezone.now()
    attached = Run.objects.filter(
        project=project, external_id=str(external_id), status=RunStatus.PENDING, created_by=actor
    ).update(
        status=RunStatus.RUNNING,
        started_at=now,
        heartbeat_at=now if host else None,
        lease_token=F("lease_token") + 1,
        writer_host=host or "",
        writer_pid=pid,
        writer_since=now,
    )
    if not attached:
        return None
    run = Run.objects.select_related("project", "created_by").get(project=project, external_id=str(external_id))
    filled = {**(parameters or {}), **(run.parameters or {})}
    if (name and not run.name) or filled != run.parameters:
        run.name, run.parameters = run.name or name, filled
        run.save(update_fields=["name", "parameters"])  # the row is this process's alone since the UPDATE above
    return run


# Asked of a preempting Run, these end it preempted: it was told to stop (docs/design/runs.md#states).
PREEMPTED_OUTCOMES = frozenset({RunStatus.FAILED, RunStatus.CRASHED, RunStatus.PREEMPTED})


def _status_after(run: Run, old: str, asked: str) -> str:
    """The status ``asked`` leads to from ``old`` (docs/design/runs.md#states); ``Conflict`` when the change is
    refused."""
    if old in FINAL_STATES:
        if asked == old or (old == RunStatus.PREEMPTED and asked in PREEMPTED_OUTCOMES):
            return old
        if asked == RunStatus.RUNNING:
            raise Conflict(
                f"run {run.external_id} ended as {old}; only a resume restarts it "
                f"(start_run(id={run.external_id!r}, resume='allow'))",
                field="status",
            )
        raise Conflict(f"run {run.external_id} already ended as {old}; it cannot become {asked}", field="status")
    if old == RunStatus.PREEMPTING:
        if asked in PREEMPTED_OUTCOMES:
            return RunStatus.PREEMPTED
        if asked in (RunStatus.RUNNING, RunStatus.PENDING):
            raise Conflict(
                f"run {run.external_id} is preempting: it can only end (finished or preempted), not become {asked}",
                field="status",
            )
    return asked


@transaction.atomic
def run_set_status(*, actor, run: Run, status: str, fencing_token: int | None = None) -> Run:
    """Move ``run`` to ``status`` (member or admin of its Project); the Run as stored (docs/design/runs.md#states).

    Rules: running → preempting is allowed and preempting is sticky (→
    running or pending: ``Conflict``); from preempting, finished stays
    finished while failed, crashed or preempted end it ``preempted``. A
    final state (finished, failed, aborted, crashed, preempted) is kept:
    the same one again is idempotent (failed or crashed asked of a preempted
    Run too), running raises ``Conflict`` ("only a resume restarts it"),
    another raises ``Conflict``. ``fencing_token`` (the ``Mado-Fencing-Token``
    header; None: not fenced) is checked under the Run's row lock
    (``LeaseLost`` when stale). The change is a conditional UPDATE on the
    old status. Entering a final state sets ``ended_at`` and calls
    ``runs.liveness.run_ended_effects`` (MLflow checkpoint files, sweep trial).
    ``heartbeat_at`` is refreshed only for a Run that sends heartbeats, so a
    Run that never did (MLflow) is never reaped as crashed.
    """
    policy.require_run_writer(actor, run)
    if status not in RunStatus.values:
        raise ValidationFailed(f"status must be one of {', '.join(RunStatus.values)}", field="status")
    lease_check(run_id=run.pk, token=fencing_token)
    locked = Run.objects.select_for_update().only("status", "heartbeat_at", "started_at").get(pk=run.pk)
    old = locked.status
    status = _status_after(run, old, status)
    if old == status:
        _reread_own_fields(run)
        return run
    now = timezone.now()
    changes = {"status": status}
    if locked.heartbeat_at is not None:
        changes["heartbeat_at"] = now
    if status in FINAL_STATES:
        changes["ended_at"] = now
    if status == RunStatus.RUNNING and locked.started_at is None:
        changes["started_at"] = now
    if Run.objects.filter(pk=run.pk, status=old).update(**changes) == 0:
        raise Conflict(f"run {run.external_id} changed status meanwhile; try again", field="status")
    _reread_own_fields(run)
    audit_record(
        actor=actor,
        action="run.end" if status in FINAL_STATES else "run.set_status",
        obj=run,
        object_repr=f"run {run.pk} {run.name}",
        project_id=run.project_id,
        changes={"status": [old, status]},
    )
    if status in FINAL_STATES:
        run_ended_effects(run=run)
    return run


def _reread_own_fields(run: Run) -> None:
    """Reload ``run``'s own columns, keeping the related rows read with it (its Project, creator, parent): a
    plain ``refresh_from_db`` drops them, and the answer would read each again."""
    run.refresh_from_db(fields=[field.attname for field in Run._meta.concrete_fields if not field.is_relation])


def run_table_columns_save(*, user, project: Project, column_ids: list[str]) -> list[str]:
    """Remember ``user``'s runs-table columns in ``project`` (docs/design/interfaces.md#workspace); an empty list
    forgets them (the defaults come back). Any member may: it changes no Run. A double submit ends with one row, the
    last choice.

    Returns the saved column ids. Raises ``ValidationFailed`` (field ``col``) as ``table.parse_columns``.
    """
    columns = [column.id for column in parse_columns(column_ids)]
    mine = RunTableColumns.objects.filter(user=user, project=project)
    if not columns:
        mine.delete()
        return []
    if not mine.update(columns=columns, updated_at=timezone.now()):
        try:
            with transaction.atomic():
                RunTableColumns.objects.create(user=user, project=project, columns=columns)
        except IntegrityError:  # created by a concurrent submit meanwhile: this one is the last choice
            mine.update(columns=columns, updated_at=timezone.now())
    return columns
