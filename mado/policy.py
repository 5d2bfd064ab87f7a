"""The one permission policy of mado (docs/design/house.md#one-policy, #permissions).

Roles rank viewer < member < admin within a Project:

- viewer reads everything in the Project;
- member also creates Runs and launches Jobs, and writes to the Runs the
  write rule below gives them;
- admin also manages members, deletes artifacts and writes to every Run.

The write rule (docs/design/runs.md#write-rule): a Run is written — metrics, params, artifacts,
checkpoints, data stages, status, heartbeat, same-run resume by id — only by
its creator, its Job's Run token (which acts as the Job's creator, who
created the Run, and only on that Run), the user whose sweep agent holds the
Run's trial, or a Project admin; other members and viewers read it
(``why_cannot_write_run``). A Job's stop, rerun and resume follow the same
people (``why_cannot_manage_job``, docs/design/resume.md#who-may-resume). This module imports no app: callers
pass what it needs (a Run, its Job) and the docs/api.md table mirrors it.

Objects are looked up within the user's Projects, so another Project's object
is indistinguishable from a missing one (404); a visible object the user may
not change answers 403. Querysets expose this as ``visible_to(user)`` and
``editable_by(user)``; pages, API and admin call the functions below.
"""

from django.db.models import Q
from django.utils.translation import gettext as _

from mado.errors import Forbidden

VIEWER = "viewer"
MEMBER = "member"
ADMIN = "admin"
ROLE_RANK = {VIEWER: 1, MEMBER: 2, ADMIN: 3}


def roles_at_least(role: str) -> list[str]:
    """Role names that rank at or above ``role``."""
    return [name for name, rank in ROLE_RANK.items() if rank >= ROLE_RANK[role]]


def membership_q(user, *, role: str = VIEWER, project_path: str = "") -> Q:
    """A ``Q`` that keeps rows whose Project has ``user`` as a member with at least ``role``.

    ``project_path`` is the lookup from the queried model to its Project
    (``""`` for Project itself, ``"project"`` for Run, ``"run__project"``...).
    An anonymous or inactive user matches nothing, and so does a request whose
    API token's scope acts below ``role`` (``limit_to_scope``): admin reads
    honour token scope like admin writes.
    """
    if user is None or not user.is_authenticated or not user.is_active:
        return Q(pk__in=[])
    scope = user.__dict__.get(_SCOPE)
    if scope is not None and ROLE_RANK[role] > ROLE_RANK[SCOPE_CAP[scope]]:
        return Q(pk__in=[])  # the request's token acts below ``role`` everywhere (docs/api.md#tokens)
    prefix = f"{project_path}__" if project_path else ""
    return Q(
        **{
            f"{prefix}memberships__user": user,
            f"{prefix}memberships__role__in": roles_at_least(role),
        }
    )


_KNOWN_ROLES = "_policy_roles"  # on a Project instance: {user id: role} read with the object that led to it


def remember_role(user, project, role: str | None) -> None:
    """Keep ``user``'s ``role`` in ``project`` (None: not a member) on that Project instance, read in the same
    query as an object of it (``runs.selectors.run_get_for_user``), so ``role_in`` on it asks the database no
    more: the checks of one request need no query of their own (the metrics POST is the hot path,
    docs/design/resume.md#steps-continue)."""
    project.__dict__.setdefault(_KNOWN_ROLES, {})[user.pk] = role


_SCOPE = "_policy_token_scope"  # on a user instance: the scope of the API token this request came with
SCOPE_CAP = {"read": VIEWER, "write": MEMBER, "admin": ADMIN}  # the highest role a token of each scope acts as


def limit_to_scope(user, scope: str | None) -> None:
    """Let ``user`` (the instance of this request) act at most as ``scope`` allows (docs/api.md#tokens): a ``read``
    token as a viewer, a ``write`` token as a member, an ``admin`` token with the user's full role; None: no
    limit (a session, a password, a Run token)."""
    user.__dict__[_SCOPE] = scope


def _capped(user, role: str | None) -> str | None:
    scope = user.__dict__.get(_SCOPE)
    if role is None or scope is None or ROLE_RANK[role] <= ROLE_RANK[SCOPE_CAP[scope]]:
        return role
    return SCOPE_CAP[scope]


def _member_role(user, project) -> str | None:
    """The user's role in ``project`` from the membership alone (no token scope applied)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    known = project.__dict__.get(_KNOWN_ROLES, {})
    if user.pk in known:
        return known[user.pk]
    # values_list: a model instance from ``only("role")`` would fetch its deferred project_id in a second query
    return project.memberships.filter(user=user).values_list("role", flat=True).first()


def role_in(user, project) -> str | None:
    """The user's role in ``project``, or None when not a member (or anonymous); a request made with an API token
    acts at most with its scope's role (``limit_to_scope``)."""
    role = _member_role(user, project)
    return _capped(user, role) if role is not None else None


def has_role(user, project, role: str) -> bool:
    """True when the user's role in ``project`` ranks at or above ``role``."""
    actual = role_in(user, project)
    return actual is not None and ROLE_RANK[actual] >= ROLE_RANK[role]


def why_not(user, project, role: str) -> str | None:
    """None when allowed, else the sentence a page shows in place of the button (in the active language)."""
    actual = role_in(user, project)
    if actual is None:
        return _("You are not a member of this project.")
    if ROLE_RANK[actual] >= ROLE_RANK[role]:
        return None
    if actual != _member_role(user, project):
        return _("This token's scope does not allow this: create a token with a wider scope.")
    if actual == VIEWER:
        return _("Your role in this project is viewer: viewers can only read.")
    return _("Only project admins can do this.")


def can_write_runs(user, project) -> bool:
    """Create Runs, Codes and Datasets in ``project`` and launch Jobs (member or admin); writing to an existing
    Run follows ``why_cannot_write_run``."""
    return has_role(user, project, MEMBER)


def why_cannot_write_run(user, run) -> str | None:
    """None when ``user`` may write to ``run`` (docs/design/runs.md#write-rule), else the sentence shown in place of the
    action.

    ``run`` is a ``runs.Run`` with its ``project``. Writers: the Run's creator
    (so also its Job's Run token, which authenticates as the Job's creator),
    a Project admin, and the user whose sweep agent holds the Run's trial
    (``SweepTrial.is_held_by``). Reasons, first that applies: not a member,
    viewer role, not your run. Callers raise ``Forbidden`` with the sentence
    (403); a non-member never gets here (the Run's lookup answers 404).
    """
    reason = why_not(user, run.project, MEMBER)
    if reason or _writes_to(user, run):
        return reason
    return _("This is not your run: only its creator, its Job and project admins can write to it.")


def _writes_to(user, run) -> bool:
    """True for the Run's writers among the Project's members: creator, admin, holder of its sweep trial."""
    if run.created_by_id == user.pk or has_role(user, run.project, ADMIN):
        return True
    trial = getattr(run, "sweep_trial", None)  # None when the Run is not a sweep trial
    return trial is not None and trial.is_held_by(user)


def require_role(user, project, role: str) -> None:
    """Raise ``mado.errors.Forbidden`` (403) with ``why_not``'s sentence unless ``user``'s role in ``project``
    ranks at or above ``role`` (``MEMBER``: create Runs, Codes, Datasets, Sweeps and Jobs; ``ADMIN``: delete
    stored bytes; docs/design/runs.md#write-rule)."""
    reason = why_not(user, project, role)
    if reason:
        raise Forbidden(reason)


def require_run_writer(user, run) -> None:
    """Raise ``mado.errors.Forbidden`` (403) with ``why_cannot_write_run``'s sentence unless ``user`` may write to
    ``run`` (docs/design/runs.md#write-rule); every service that writes to an existing Run calls it."""
    reason = why_cannot_write_run(user, run)
    if reason:
        raise Forbidden(reason)


def why_cannot_write_logged_model(user, model) -> str | None:
    """None when ``user`` may change MLflow logged model ``model`` (its files, tags, params, status;
    docs/design/interfaces.md#mlflow; docs/design/runs.md#write-rule).

    ``model`` is a ``runs.LoggedModel`` with its ``project`` (and ``run``,
    the source Run or None). Writers: its creator, Project admins and the
    writers of its source Run (``why_cannot_write_run``), so a Job's Run
    token reaches the models its Run logged. Reasons as ``why_cannot_write_run``.
    """
    reason = why_not(user, model.project, MEMBER)
    if reason or model.created_by_id == user.pk or has_role(user, model.project, ADMIN):
        return reason
    if model.run is not None and _writes_to(user, model.run):
        return None
    return _("This is not your model: only its creator, its run's writers and project admins can change it.")


def require_logged_model_writer(user, model) -> None:
    """Raise ``mado.errors.Forbidden`` (403) with ``why_cannot_write_logged_model``'s sentence unless allowed."""
    reason = why_cannot_write_logged_model(user, model)
    if reason:
        raise Forbidden(reason)


def why_cannot_resume_by_id(user, run) -> str | None:
    """None when ``user`` may reopen ``run`` by its id (``POST runs/`` with ``resume``;
    docs/design/runs.md#resume-modes, #write-rule), else why not.

    Whoever may write to the Run (``why_cannot_write_run``) may. Any other
    member may only when the Run did not run as a Job (``Run.ran_as_job``, a
    fact the jobs app writes in the transaction that creates the Job) and its
    Project opted in (``Project.members_may_resume``, default off: W&B's "any
    team member may resume").
    """
    reason = why_cannot_write_run(user, run)
    if reason is None or run.ran_as_job or not run.project.members_may_resume:
        return reason
    return why_not(user, run.project, MEMBER)


def is_service_account(user) -> bool:
    """True for a Project's service account (a user with a ``service_account``, docs/api.md#service-accounts)."""
    return getattr(user, "service_account", None) is not None


def why_cannot_create_project(user) -> str | None:
    """None when ``user`` may create a Project (and so become its admin), else why not (docs/api.md#tokens,
    #service-accounts): a service account acts only in its own Project, and a ``read`` token writes nothing."""
    if is_service_account(user):
        return _("A service account acts only in its own project: it cannot create projects.")
    if user.__dict__.get(_SCOPE) == "read":
        return _("This token may only read: create a token with the write scope to change anything.")
    return None


def why_cannot_make_tokens(actor) -> str | None:
    """None when ``actor`` may make API tokens (its own, or a service account's as its Project's admin), else why
    not: a service account's tokens are made by its Project's admins, never by itself (docs/api.md#service-accounts)."""
    if is_service_account(actor):
        return _("A service account cannot make tokens: its project's admins make them.")
    return None


def can_manage_members(user, project) -> bool:
    """Add, change and remove Project members."""
    return has_role(user, project, ADMIN)


def can_delete_artifacts(user, project) -> bool:
    """Delete a stored artifact (docs/design/checkpoints.md#deletion: Project admin only)."""
    return has_role(user, project, ADMIN)


# --- Jobs: stop, rerun and resume (docs/design/resume.md#who-may-resume, #latest-checkpoint, #conditions) -------------

RESUMABLE_KINDS = ("training", "fine_tuning")
RESUMABLE_STATUSES = ("failed", "aborted", "preempted")  # docs/design/resume.md#from-a-checkpoint


def why_cannot_manage_job(user, run) -> str | None:
    """None when ``user`` may stop, rerun or resume ``run``'s Job (docs/design/resume.md#who-may-resume: the writers of
    ``why_cannot_write_run``), else the sentence shown instead of the button."""
    reason = why_not(user, run.project, MEMBER)
    if reason or _writes_to(user, run):
        return reason
    return _("This is not your run: only its creator and project admins can stop, rerun or resume its Job.")


def why_run_not_resumable(run, *, job, has_checkpoint: bool | None) -> str | None:
    """None when ``run``'s state allows a resume, else why not
    (docs/design/resume.md#who-may-resume, #latest-checkpoint, #conditions); who asks is not considered.

    ``job`` is the Run's ``jobs.Job`` or None, ``has_checkpoint`` whether the latest-checkpoint
    rule finds a checkpoint to resume from (``jobs.selectors.latest_resume_checkpoint``),
    or None when not asked (the Checkpoint tab's button names its
    checkpoint); the caller reads both, so this module imports no app.
    Refused: a Run that did not run as a Job, whose Job has not ended, that
    finished (continue instead) or ended otherwise than failed / aborted / preempted, of
    a kind other than training / fine-tuning, and one with no checkpoint.
    """
    if job is None:
        return _(
            "This run did not run as a Job, so it cannot be resumed: "
            "use “Continue training from these weights” instead."
        )
    if job.status == "queued":
        return _("The run's Job has not started yet: it can be resumed once it has failed or been aborted.")
    if not job.is_final or run.status in ("pending", "running", "preempting"):
        return _("The run is still running: it can be resumed once its Job has failed or been aborted.")
    if run.status == "finished":
        return _("The run finished: use “Continue training from these weights” instead of resume.")
    if run.status not in RESUMABLE_STATUSES:
        return _("The run ended %(status)s: only failed, aborted or preempted runs can be resumed.") % {
            "status": run.status
        }
    if run.kind not in RESUMABLE_KINDS:
        return _("Only training and fine-tuning runs can be resumed.")
    if has_checkpoint is False:
        return _("The run has no complete checkpoint to resume from.")
    return None


def why_cannot_resume(user, run, *, job, has_checkpoint: bool | None) -> str | None:
    """None when ``user`` may resume ``run`` now, else the one sentence a page shows in place of the button
    (docs/design/resume.md#who-may-resume).

    Reasons, first that applies: not a member, viewer role, not your run
    (creator or admin only), then ``why_run_not_resumable`` (``job`` and
    ``has_checkpoint`` as there).
    """
    return why_cannot_manage_job(user, run) or why_run_not_resumable(run, job=job, has_checkpoint=has_checkpoint)


# --- Continue training from a checkpoint (docs/design/resume.md#continue, #continue-lineage) --------------------------


def why_cannot_continue(user, checkpoint) -> str | None:
    """None when ``user`` may continue training from ``checkpoint``, else the sentence shown instead of the button.

    Any member or admin of the checkpoint's Project, whatever the state of
    its Run (finished included, with or without a Job); the checkpoint must
    be ``complete`` (not pending, not deleted).
    """
    reason = why_not(user, checkpoint.run.project, MEMBER)
    if reason:
        return reason
    if checkpoint.state != "complete":
        return _("Only a complete checkpoint can be continued from (this one is %(state)s).") % {
            "state": checkpoint.state
        }
    return None


# --- Alerts (docs/design/alerts.md#who) ---------------------------------------------------------------------------


def why_cannot_manage_alerts(user, project, *, owner_id: int | None) -> str | None:
    """None when ``user`` may create, change or delete an alert rule of ``project`` (``owner_id`` None: a Project
    rule or a channel, Project admins only; else a personal subscription of user ``owner_id``: that member, or an
    admin removing it), else the sentence shown instead of the button. Viewers manage nothing."""
    if owner_id is None or (user is not None and owner_id != user.pk):
        return why_not(user, project, ADMIN)
    return why_not(user, project, MEMBER)


def require_alerts_manager(user, project, *, owner_id: int | None) -> None:
    """Raise ``mado.errors.Forbidden`` (403) with ``why_cannot_manage_alerts``'s sentence unless allowed."""
    reason = why_cannot_manage_alerts(user, project, owner_id=owner_id)
    if reason:
        raise Forbidden(reason)
