"""Service accounts of a Project (docs/api.md#service-accounts): made by its admins, with a role there and tokens
the admins make and revoke; they never sign in interactively."""

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils.text import slugify
from django.utils.translation import gettext as _

from mado import policy, tokens
from mado.audit import audit_record
from mado.errors import Conflict, Forbidden, NotFound, ValidationFailed
from mado.models import ApiToken, TokenScope
from runs.models import Membership, Project, Role, ServiceAccount


def _require_admin(actor, project: Project) -> None:
    """Only the Project's (human) admins manage its service accounts: a service account, even an admin one, makes
    no accounts or tokens, its own included (``Forbidden``)."""
    refusal = policy.why_cannot_make_tokens(actor)
    if refusal:
        raise Forbidden(refusal)
    policy.require_role(actor, project, policy.ADMIN)


def service_account_list(*, actor, project: Project):
    """The Project's service accounts with their users (Project admins only: ``Forbidden`` otherwise)."""
    _require_admin(actor, project)
    return project.service_accounts.select_related("user").prefetch_related("user__memberships")


@transaction.atomic
def service_account_create(*, actor, project: Project, name: str, role: str = Role.MEMBER) -> ServiceAccount:
    """Make service account ``name`` (letters, digits, ``-``; at most 50) of ``project`` with ``role``.

    Its user is named ``<project slug>.<name>`` and has no usable password.
    Project admins only (``Forbidden``); ``ValidationFailed`` for a bad name or
    role; ``Conflict`` (field ``name``) when the name or the user name is taken.
    """
    _require_admin(actor, project)
    if not name or slugify(name) != name or len(name) > 50:
        raise ValidationFailed(_("Use 1 to 50 lower-case letters, digits and hyphens."), field="name")
    if role not in Role.values:
        raise ValidationFailed(_("role must be one of %(choices)s") % {"choices": ", ".join(Role.values)}, field="role")
    try:
        with transaction.atomic():
            user = get_user_model()(username=f"{project.slug}.{name}")
            user.set_unusable_password()
            user.save()
            account = ServiceAccount.objects.create(user=user, project=project, name=name, created_by=actor)
            Membership.objects.create(user=user, project=project, role=role)
    except IntegrityError:
        raise Conflict(_("This name is taken: choose another."), field="name") from None
    audit_record(
        actor=actor, action="service_account.create", obj=account, project_id=project.pk, changes={"role": [None, role]}
    )
    return account


def service_account_get(*, actor, project: Project, name: str) -> ServiceAccount:
    """Service account ``name`` of ``project`` (admins only: ``Forbidden``); ``NotFound`` when there is none."""
    _require_admin(actor, project)
    account = project.service_accounts.select_related("user").filter(name=name).first()
    if account is None:
        raise NotFound(_("There is no service account of that name in this project."), field="name")
    return account


def service_account_token_create(
    *, actor, account: ServiceAccount, name: str, scope: str = TokenScope.WRITE, expires_in_days: int | None = None
) -> tuple[ApiToken, str]:
    """A token for ``account`` made by a Project admin; ``(token, key)``, the key shown once
    (``mado.tokens.api_token_create``, whose errors it raises)."""
    _require_admin(actor, account.project)
    return tokens.api_token_create(
        user=account.user, name=name, scope=scope, expires_in_days=expires_in_days, actor=actor
    )


def service_account_token_revoke(*, actor, account: ServiceAccount, token_id: int) -> ApiToken:
    """Revoke token ``token_id`` of ``account`` (admins only); ``NotFound`` for another user's token."""
    _require_admin(actor, account.project)
    return tokens.api_token_revoke(user=account.user, token_id=token_id, actor=actor)
