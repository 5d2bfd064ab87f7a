"""Who a single sign-on subject is (docs/deploy.md#single-sign-on): the user an ``(issuer, subject)`` pair is bound
to, made or linked at its first sign-in.

The provider's ``preferred_username`` and ``email`` are names a provider
account gives itself; they never pick an existing user. A new subject gets a
new user under a free name derived from them (``root`` taken: ``root-2``),
unless the operator turned on linking by verified e-mail
(``MADO_OIDC_LINK_VERIFIED_EMAIL``): then a subject whose provider says its
e-mail is verified links to the one active account with that address, never
a superuser's or a service account's and never one already bound to another
subject of the issuer. Every new binding is an audit record. Superusers and
service accounts are reached through sign-on only when an admin binds them
(``identity_link``: the Django admin's "External identities").
"""

import re

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from mado.audit import audit_record
from runs.models import ExternalIdentity, IdentityLink, Project

USERNAME_MAX = 150  # Django's username column
_NOT_IN_USERNAME = re.compile(r"[^\w.@+-]")  # Django's username validator's characters


class SignOnRefused(Exception):
    """The provider's answer signs nobody in; ``str(error)`` says why, for the login page and the audit log."""


def claimed_name(claims: dict) -> str:
    """The name the provider gives the person (``preferred_username``, else ``email``, else ``sub``), for records."""
    for key in ("preferred_username", "email", "sub"):
        if isinstance(claims.get(key), str) and claims[key]:
            return claims[key][:USERNAME_MAX]
    return ""


def email_verified(claims: dict) -> bool:
    """True when the provider says ``email`` is verified (``email_verified`` true, or "true" as some providers send
    it)."""
    return claims.get("email_verified") in (True, "true") and isinstance(claims.get("email"), str)


def free_username(claims: dict) -> str:
    """A user name no account has (compared without case): the claimed name in Django's user-name characters,
    then ``-2``, ``-3``… until one is free. A name in a service account's form, ``<project slug>.<name>`` of a
    Project that exists, has that dot made a hyphen, so nobody signs on under a name a Project's admin may give
    a service account."""
    base = claims.get("preferred_username") or str(claims.get("email") or "").partition("@")[0]
    base = _NOT_IN_USERNAME.sub("-", str(base or "user"))[: USERNAME_MAX - 8].strip(".-") or "user"
    prefix, dot, _rest = base.partition(".")
    if dot and Project.objects.filter(slug__iexact=prefix).exists():
        base = base.replace(".", "-", 1)  # <project>.<name> is a service account's (runs.service_accounts)
    taken = {
        name.lower()
        for name in get_user_model().objects.filter(username__istartswith=base).values_list("username", flat=True)
    }
    candidate, number = base, 1
    while candidate.lower() in taken:
        number += 1
        candidate = f"{base}-{number}"
    return candidate


def _linkable_by_email(issuer: str, claims: dict):
    """The one account a verified e-mail links to (see the module's docstring), or None."""
    if not settings.MADO_OIDC_LINK_VERIFIED_EMAIL or not email_verified(claims):
        return None
    accounts = list(
        get_user_model()
        .objects.filter(email__iexact=claims["email"], is_active=True, is_superuser=False, service_account=None)
        .exclude(external_identities__issuer=issuer)[:2]
    )
    return accounts[0] if len(accounts) == 1 else None


def _bind(*, actor, user, issuer: str, subject: str, linked_by: str) -> ExternalIdentity:
    identity = ExternalIdentity.objects.create(issuer=issuer, subject=subject, user=user, linked_by=linked_by)
    audit_record(
        actor=actor,
        action="identity.link",
        obj=identity,
        object_repr=f"{subject} at {issuer} → {user.get_username()}",
        changes={"user": [None, user.get_username()], "linked_by": [None, linked_by]},
    )
    return identity


def sign_on_user(*, issuer: str, claims: dict):
    """The user ``claims`` (the provider's userinfo, its ``sub`` already checked against the ID token's) sign in as.

    A known ``(issuer, sub)`` is its user, whatever names the claims carry
    now; a new one is bound as the module's docstring says. Two first
    sign-ins of one subject at once make one user (the unique binding
    decides; the other request finds it). Raises ``SignOnRefused`` when
    ``sub`` is missing or longer than 255 characters.
    """
    subject = claims.get("sub")
    if not isinstance(subject, str) or not 0 < len(subject) <= 255:
        raise SignOnRefused("the provider's answer has no usable subject (sub)")
    for _attempt in range(5):
        identity = ExternalIdentity.objects.select_related("user").filter(issuer=issuer, subject=subject).first()
        if identity is not None:
            return identity.user
        try:
            with transaction.atomic():
                user, linked_by = _linkable_by_email(issuer, claims), IdentityLink.VERIFIED_EMAIL
                if user is None:
                    user, linked_by = _new_user(claims), IdentityLink.SIGN_UP
                _bind(actor=None, user=user, issuer=issuer, subject=subject, linked_by=linked_by)
                return user
        except IntegrityError:
            continue  # the same subject bound, or the free name taken, by a sign-in at the same moment: look again
    raise SignOnRefused("the account could not be made: try again")


def _new_user(claims: dict):
    user = get_user_model().objects.create_user(
        free_username(claims), email=claims["email"] if email_verified(claims) else ""
    )
    user.set_unusable_password()  # signs in through the provider only
    user.save(update_fields=["password"])
    return user


@transaction.atomic
def identity_link(*, actor, user, issuer: str, subject: str) -> ExternalIdentity:
    """Bind ``(issuer, subject)`` to ``user`` by an admin's hand (the only way to a superuser or a service account);
    ``IntegrityError`` when the subject is bound already."""
    return _bind(actor=actor, user=user, issuer=issuer, subject=subject, linked_by=IdentityLink.ADMIN)


@transaction.atomic
def identity_unlink(*, actor, identity: ExternalIdentity) -> None:
    """Remove the binding ``identity`` (an admin's hand): its subject's next sign-in is a first one again."""
    audit_record(
        actor=actor,
        action="identity.unlink",
        obj=identity,
        object_repr=f"{identity.subject} at {identity.issuer} → {identity.user.get_username()}",
        changes={"user": [identity.user.get_username(), None]},
    )
    identity.delete()
