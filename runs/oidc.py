"""Company sign-in with OpenID Connect (docs/deploy.md#single-sign-on) through ``mozilla-django-oidc``.

``mozilla-django-oidc`` rather than ``django-allauth``: mado needs one
provider, the authorization code flow with PKCE, state and nonce kept in
the session, and the ID token checked against the provider's JWKS (fetched
at each sign-in, so a rotated key is picked up) — a small, focused library
whose backend is one class to extend, where allauth brings its own account
pages, e-mail flows and models. The library checks the signature and the
nonce; ``MadoOIDCBackend`` adds what it leaves out: the issuer, the audience
and authorized party (the client id), the subject and the token's times, and
that the userinfo speaks of the same subject. A user is the one bound to the
provider's ``(issuer, subject)`` (``runs.identities``), never the one a
claimed name or e-mail matches, and their Project roles follow the configured
claim at every sign-in (``sync_roles``). Every refusal ends on the login page
with its reason and an audit record.
"""

import base64
import json
import logging
import time

import requests
from django.conf import settings
from django.contrib import auth, messages
from django.contrib.auth.views import LoginView
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.http import Http404, HttpResponseForbidden
from django.utils.encoding import force_bytes
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from mado.audit import audit_record, audit_sign_in
from mado.errors import Conflict
from mado.policy import ROLE_RANK
from runs.identities import SignOnRefused, claimed_name, email_verified, sign_on_user
from runs.models import Membership, Project, Role
from runs.services import guard_last_admin

logger = logging.getLogger(__name__)


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
    added, changed or removed, each change an audit record by the system (the sign-in). A Project's last admin
    stays admin whatever the claim says (``membership.keep_last_admin`` in the audit log)."""
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
        repr_note = "sign-in claim"
        if before == Role.ADMIN and _is_last_admin(project, membership):
            action, role = "membership.keep_last_admin", before
            repr_note = "sign-in claim; kept: the Project's last admin"
        elif before is None:
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
            object_repr=f"{user.get_username()} in {slug} ({repr_note})",
            project_id=project.pk,
            changes={"role": [before, wanted.get(slug)]},
        )


def _is_last_admin(project: Project, membership: Membership) -> bool:
    """True when ``membership`` is ``project``'s only admin (the rule behind the members API's 409)."""
    try:
        guard_last_admin(project, membership)
    except Conflict:
        return True
    return False


def check_id_token(payload: dict, *, client_id: str, now: float | None = None) -> None:
    """Raise ``SuspiciousOperation`` naming the claim unless the ID token ``payload`` (signature and nonce checked)
    is for ``client_id`` (``aud``, and ``azp`` when present or when there are several audiences), from
    ``MADO_OIDC_ISSUER`` (``iss``), names a subject (``sub``), was issued (``iat``) and is valid now (``nbf``,
    ``exp``), within ``MADO_OIDC_CLOCK_SKEW_S`` seconds (docs/deploy.md#single-sign-on)."""
    now, skew = time.time() if now is None else now, settings.MADO_OIDC_CLOCK_SKEW_S
    audience = payload.get("aud")
    audience = [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []
    if client_id not in audience:
        raise SuspiciousOperation("the ID token is not meant for this client (aud)")
    if ("azp" in payload or len(audience) > 1) and payload.get("azp") != client_id:
        raise SuspiciousOperation("the ID token was issued to another client (azp)")
    if payload.get("iss") != settings.MADO_OIDC_ISSUER:
        raise SuspiciousOperation("the ID token comes from another issuer (iss)")
    if not isinstance(payload.get("sub"), str) or not payload["sub"]:
        raise SuspiciousOperation("the ID token names no subject (sub)")
    times = {name: payload.get(name) for name in ("exp", "iat", "nbf")}
    if not all(value is None or type(value) in (int, float) for value in times.values()):
        raise SuspiciousOperation("the ID token's times are not numbers (exp, iat, nbf)")
    if times["exp"] is None or times["exp"] + skew < now:
        raise SuspiciousOperation("the ID token has expired (exp)")
    if times["iat"] is None or times["iat"] - skew > now:
        raise SuspiciousOperation("the ID token was issued in the future (iat)")
    if times["nbf"] is not None and times["nbf"] - skew > now:
        raise SuspiciousOperation("the ID token is not valid yet (nbf)")


def _header_algorithm(token) -> str | None:
    """The ``alg`` of a compact JWS's protected header, None when there is none to read."""
    try:
        header = json.loads(base64.urlsafe_b64decode(force_bytes(token).split(b".")[0] + b"==="))
    except (ValueError, TypeError):
        return None
    return header.get("alg") if isinstance(header, dict) else None


class MadoOIDCBackend(OIDCAuthenticationBackend):
    """The library's code flow with the ID token's claims checked (``check_id_token``), the userinfo's subject
    compared with the ID token's, and the user found by ``(issuer, subject)`` (``runs.identities``)."""

    def verify_token(self, token, **kwargs):
        """The ID token's payload once its signature and nonce (the library) and its claims (above) hold;
        ``SuspiciousOperation`` for a token that fails them or cannot be read at all."""
        algorithm = _header_algorithm(token)
        if algorithm != self.OIDC_RP_SIGN_ALGO:
            raise SuspiciousOperation(f"the ID token is not signed with {self.OIDC_RP_SIGN_ALGO} (alg {algorithm!r})")
        try:
            payload = super().verify_token(token, **kwargs)
        except (SuspiciousOperation, requests.RequestException):
            raise
        except Exception as error:  # noqa: BLE001 - a token the JOSE library cannot parse is a refused token
            raise SuspiciousOperation(f"the ID token could not be read ({type(error).__name__})") from error
        check_id_token(payload, client_id=self.OIDC_RP_CLIENT_ID)
        return payload

    def get_userinfo(self, access_token, id_token, payload):
        """The userinfo claims over the ID token's; ``SignOnRefused`` when their ``sub`` differs (raised past the
        library, which would swallow a ``SuspiciousOperation`` here without a reason)."""
        userinfo = super().get_userinfo(access_token, id_token, payload)
        if not isinstance(userinfo, dict) or userinfo.get("sub") != payload["sub"]:
            raise SignOnRefused("the provider's userinfo names another subject than the ID token (sub)")
        return {**payload, **userinfo}

    def get_or_create_user(self, access_token, id_token, payload):
        """The user bound to the token's subject (made or linked at its first sign-in), updated from the claims."""
        claims = self.get_userinfo(access_token, id_token, payload)
        self.request.mado_sign_in_name = claimed_name(claims)
        user = sign_on_user(issuer=settings.MADO_OIDC_ISSUER, claims=claims)
        return self.update_user(user, claims) if user.is_active else user

    def update_user(self, user, claims):
        """Names from the claims; the e-mail only when the provider says it is verified; roles from the claim."""
        fields = {"first_name": claims.get("given_name"), "last_name": claims.get("family_name")}
        fields = {name: value[:150] for name, value in fields.items() if isinstance(value, str)}
        if email_verified(claims):
            fields["email"] = claims["email"][:254]
        for name, value in fields.items():
            setattr(user, name, value)
        if fields:
            user.save(update_fields=list(fields))
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
    """``oidc/callback/``: back from the provider. Every outcome is an audit record; a refusal of any kind (a
    failed check, a provider error, an unknown state, a deactivated account) signs nobody in and ends on the login
    page with the reason, never an error page."""

    def get(self, request):
        try:
            return super().get(request)
        except Exception as error:  # noqa: BLE001 - whatever failed, the person lands on the login page, told why
            if not isinstance(error, SuspiciousOperation | SignOnRefused | requests.RequestException):
                logger.exception("single sign-on failed")
            return self.login_failure(reason=_reason(error))

    def login_success(self):
        audit_sign_in(user=self.user, name=self.user.get_username(), method="oidc", result="signed in")
        return super().login_success()

    def login_failure(self, reason: str = ""):
        if not reason:
            error = self.request.GET.get("error")
            inactive = getattr(self, "user", None) is not None
            reason = (
                f"the provider answered {error[:100]!r}"
                if error
                else "the account is deactivated"
                if inactive
                else "the sign-in expired or was already used: start again"
            )
        if self.request.user.is_authenticated:
            auth.logout(self.request)
        audit_sign_in(user=None, name=getattr(self.request, "mado_sign_in_name", ""), method="oidc", result=reason)
        messages.error(self.request, f"Single sign-on refused: {reason}.")
        return super().login_failure()


def _reason(error: Exception) -> str:
    """What the login page and the audit record say about ``error``."""
    if isinstance(error, SuspiciousOperation | SignOnRefused):
        return str(error)
    if isinstance(error, requests.RequestException):
        return "the identity provider did not answer as expected: try again, or ask your administrator"
    return "the sign-in failed on our side: try again, or ask your administrator"


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
