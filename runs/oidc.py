"""Company sign-in with OpenID Connect (docs/deploy.md#single-sign-on) through ``mozilla-django-oidc``.

``mozilla-django-oidc`` rather than ``django-allauth``: mado needs one
provider, the authorization code flow with PKCE, state and nonce kept in
the session, and the ID token checked against the provider's JWKS (fetched
at each sign-in, so a rotated key is picked up) — a small, focused library
whose backend is one class to extend, where allauth brings its own account
pages, e-mail flows and models. The library checks the signature and the
nonce; ``MadoOIDCBackend`` adds what it leaves out: the issuer, the audience
(the client id) and the expiry of the ID token. Users are found by their
``sub``-stable user name, created on first sign-in, and their Project roles
follow the configured claim at every sign-in (``sync_roles``).
"""

import logging
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.views import LoginView
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.http import Http404, HttpResponseForbidden
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from mado.audit import audit_record
from mado.policy import ROLE_RANK
from runs.models import Membership, Project

logger = logging.getLogger(__name__)
CLOCK_SKEW_S = 60


def parse_role_rules(rules: list[str]) -> list[tuple[str, str, str]]:
    """``["ml-team=vision:member", …]`` as ``[(claim value, project slug, role)]``; ``ValueError`` naming a bad rule."""
    parsed = []
    for rule in rules:
        value, _sep, target = rule.partition("=")
        slug, _sep, role = target.partition(":")
        if not value or not slug or role not in ROLE_RANK:
            raise ValueError(f"role rule {rule!r} must read CLAIM_VALUE=PROJECT_SLUG:viewer|member|admin")
        parsed.append((value.strip(), slug.strip(), role))
    return parsed


def wanted_roles(claims: dict) -> tuple[dict[str, str], set[str]]:
    """``({project slug: role}, managed slugs)`` the claims give: the highest role of every matching rule, and every
    Project some rule names (a membership there follows the claim; others are left alone)."""
    values = claims.get(settings.MADO_OIDC_ROLE_CLAIM) or []
    values = {values} if isinstance(values, str) else set(values)
    wanted, managed = {}, set()
    for value, slug, role in parse_role_rules(settings.MADO_OIDC_ROLE_RULES):
        managed.add(slug)
        if value in values and ROLE_RANK[role] > ROLE_RANK.get(wanted.get(slug), 0):
            wanted[slug] = role
    return wanted, managed


@transaction.atomic
def sync_roles(*, user, claims: dict) -> None:
    """Make ``user``'s memberships in the Projects the rules name match ``claims`` (docs/deploy.md#single-sign-on):
    added, changed or removed, each change an audit record by the system (the sign-in)."""
    wanted, managed = wanted_roles(claims)
    projects = {p.slug: p for p in Project.objects.filter(slug__in=managed)}
    current = {
        m.project.slug: m
        for m in Membership.objects.filter(user=user, project__slug__in=managed).select_related("project")
    }
    for slug, project in projects.items():
        membership, role = current.get(slug), wanted.get(slug)
        before = membership.role if membership else None
        if before == role:
            continue
        if before is None:
            action, membership = "membership.add", Membership.objects.create(user=user, project=project, role=role)
        elif role is None:
            action = "membership.remove"
            Membership.objects.filter(pk=membership.pk).delete()
        else:
            action = "membership.change_role"
            Membership.objects.filter(pk=membership.pk).update(role=role)
        audit_record(
            actor=None,
            action=action,
            object_type="runs.membership",
            object_id=membership.pk,
            object_repr=f"{user.get_username()} in {slug} (sign-in claim)",
            project_id=project.pk,
            changes={"role": [before, role]},
        )


class MadoOIDCBackend(OIDCAuthenticationBackend):
    """The library's code flow, plus issuer, audience and expiry checks, user names and roles from the claims."""

    def verify_token(self, token, **kwargs):
        """The ID token's payload once its signature and nonce (the library) and ``iss``, ``aud``, ``exp`` hold;
        ``SuspiciousOperation`` otherwise (the sign-in fails)."""
        payload = super().verify_token(token, **kwargs)
        audience = payload.get("aud")
        audience = [audience] if isinstance(audience, str) else audience or []
        if self.OIDC_RP_CLIENT_ID not in audience:
            raise SuspiciousOperation("the ID token is not meant for this client (aud)")
        if settings.MADO_OIDC_ISSUER and payload.get("iss") != settings.MADO_OIDC_ISSUER:
            raise SuspiciousOperation("the ID token comes from another issuer (iss)")
        expires = payload.get("exp")
        if not isinstance(expires, int | float) or expires + CLOCK_SKEW_S < time.time():
            raise SuspiciousOperation("the ID token has expired (exp)")
        return payload

    def get_username(self, claims):
        return claims.get("preferred_username") or claims.get("email") or claims["sub"]

    def filter_users_by_claims(self, claims):
        return get_user_model().objects.filter(username=self.get_username(claims))

    def create_user(self, claims):
        user = get_user_model().objects.create_user(self.get_username(claims), email=claims.get("email", ""))
        user.set_unusable_password()  # signs in through the provider only
        user.save(update_fields=["password"])
        return self.update_user(user, claims)

    def update_user(self, user, claims):
        user.email = claims.get("email", user.email)
        user.first_name = claims.get("given_name", user.first_name)[:150]
        user.last_name = claims.get("family_name", user.last_name)[:150]
        user.save(update_fields=["email", "first_name", "last_name"])
        sync_roles(user=user, claims=claims)
        return user


class _OnlyWhenConfigured:
    def dispatch(self, request, *args, **kwargs):
        if not settings.MADO_OIDC_ENABLED:
            raise Http404("Single sign-on is not configured on this server.")
        return super().dispatch(request, *args, **kwargs)


class SignInView(_OnlyWhenConfigured, OIDCAuthenticationRequestView):
    """``oidc/authenticate/``: off to the provider (state, nonce and PKCE verifier kept in the session)."""


class CallbackView(_OnlyWhenConfigured, OIDCAuthenticationCallbackView):
    """``oidc/callback/``: back from the provider; a failed check signs nobody in."""


class MadoLoginView(LoginView):
    """``accounts/login/``: the "Sign in with …" button when single sign-on is configured, and the password form
    unless the operator turned it off (``MADO_PASSWORD_LOGIN=0``: a posted password is refused, 403)."""

    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        return super().get_context_data(
            **kwargs,
            oidc_enabled=settings.MADO_OIDC_ENABLED,
            oidc_provider=settings.MADO_OIDC_PROVIDER_NAME,
            password_login=settings.MADO_PASSWORD_LOGIN,
        )

    def post(self, request, *args, **kwargs):
        if not settings.MADO_PASSWORD_LOGIN:
            return HttpResponseForbidden("Password sign-in is turned off: sign in with your company account.")
        return super().post(request, *args, **kwargs)
