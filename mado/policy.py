"""The one permission policy of mado (ARCHITECTURE rule 1, STYLE: Permissions).

Roles rank viewer < member < admin within a Project:

- viewer reads everything in the Project;
- member also writes Runs (create, log, update) and launches Jobs;
- admin also manages members and deletes artifacts.

Objects are looked up within the user's Projects, so another Project's object
is indistinguishable from a missing one (404); a visible object the user may
not change answers 403. Querysets expose this as ``visible_to(user)`` and
``editable_by(user)``; pages, API and admin call the functions below.
"""

from django.db.models import Q
from django.utils.translation import gettext as _

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
    An anonymous or inactive user matches nothing.
    """
    if user is None or not user.is_authenticated or not user.is_active:
        return Q(pk__in=[])
    prefix = f"{project_path}__" if project_path else ""
    return Q(
        **{
            f"{prefix}memberships__user": user,
            f"{prefix}memberships__role__in": roles_at_least(role),
        }
    )


def role_in(user, project) -> str | None:
    """The user's role in ``project``, or None when not a member (or anonymous)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    membership = project.memberships.filter(user=user).only("role").first()
    return membership.role if membership else None


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
    if actual == VIEWER:
        return _("Your role in this project is viewer: viewers can only read.")
    return _("Only project admins can do this.")


def can_write_runs(user, project) -> bool:
    """Create Runs, log metrics and artifacts, change a Run's status, launch Jobs."""
    return has_role(user, project, MEMBER)


def can_manage_members(user, project) -> bool:
    """Add, change and remove Project members."""
    return has_role(user, project, ADMIN)


def can_delete_artifacts(user, project) -> bool:
    """Delete a stored artifact (SPEC F5: Project admin only)."""
    return has_role(user, project, ADMIN)


# --- Jobs: stop, rerun and resume (SPEC F6, F8, F9; issue 4) -------------------------

RESUMABLE_KINDS = ("training", "fine_tuning")


def can_manage_job(user, run) -> bool:
    """Stop, rerun or resume the Job of ``run``: the Run's creator (member or above) or a Project admin (F6)."""
    return why_cannot_manage_job(user, run) is None


def why_cannot_manage_job(user, run) -> str | None:
    """None when ``user`` may stop, rerun or resume ``run``'s Job, else the sentence shown instead of the button."""
    reason = why_not(user, run.project, MEMBER)
    if reason:
        return reason
    if run.created_by_id == user.pk or has_role(user, run.project, ADMIN):
        return None
    return _("This is not your run: only its creator and project admins can stop, rerun or resume its Job.")


def why_run_not_resumable(run, *, need_checkpoint: bool = True) -> str | None:
    """None when ``run``'s state allows a resume, else why not (F6, F8, F9); who asks is not considered.

    Refused: a Run that did not run as a Job, whose Job has not ended, that
    finished (continue instead) or ended otherwise than failed / aborted, of
    a kind other than training / fine-tuning, and — with ``need_checkpoint``
    (resume from latest) — one with no checkpoint to resume from (F8's rule,
    ``jobs.selectors.latest_resume_checkpoint``).
    """
    from jobs.models import ACTIVE_STATES, Job
    from jobs.selectors import latest_resume_checkpoint

    job = Job.objects.filter(run_id=run.pk).only("status").first()
    if job is None:
        return _(
            "This run did not run as a Job, so it cannot be resumed: use “Continue training from these weights” instead."
        )
    if job.status in ACTIVE_STATES or run.status in ("pending", "running", "preempting"):
        return _("The run is still running: it can be resumed once its Job has failed or been aborted.")
    if run.status == "finished":
        return _("The run finished: use “Continue training from these weights” instead of resume.")
    if run.status not in ("failed", "aborted"):
        return _("The run ended %(status)s: only failed or aborted runs can be resumed.") % {"status": run.status}
    if run.kind not in RESUMABLE_KINDS:
        return _("Only training and fine-tuning runs can be resumed.")
    if need_checkpoint and latest_resume_checkpoint(run=run) is None:
        return _("The run has no complete checkpoint to resume from.")
    return None


def why_cannot_resume(user, run, *, need_checkpoint: bool = True) -> str | None:
    """None when ``user`` may resume ``run`` now, else the one sentence a page shows in place of the button (F6).

    Reasons, first that applies: not a member, viewer role, not your run
    (creator or admin only), then ``why_run_not_resumable``: not a Job,
    still running, finished (use continue), other end state, kind, no
    checkpoint (only with ``need_checkpoint``: the "Resume from latest"
    button; the Checkpoint tab's button names its checkpoint).
    """
    return why_cannot_manage_job(user, run) or why_run_not_resumable(run, need_checkpoint=need_checkpoint)


# --- Continue training from a checkpoint (SPEC F22, F23; issue 5) ---------------------


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
