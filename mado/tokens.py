"""API tokens stored only as digests (docs/api.md#tokens): making, finding, creating, revoking.

A key is ``mado_`` + 43 URL-safe characters (256 random bits). The database
keeps its first ``PREFIX_LENGTH`` characters (to find the row with an index)
and its SHA-256 digest (compared in constant time): a copy of the database —
a backup, a replica, a support dump — hands over no usable key. A slow
password hash is not needed: the secret is random and long, so its digest
cannot be reversed by guessing, and every API request checks one.

This small module rather than ``django-rest-knox``: knox has no token
names, scopes, last-used address nor a way to carry the existing plain
tokens over, and its own authentication class would be a second one beside
``mado.authentication``, which every surface (``/api/v1/``, MLflow tracking
and artifacts) shares.
"""

import base64
import hashlib
import hmac
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext as _

from mado.audit import audit_record
from mado.errors import Conflict, NotFound, ValidationFailed
from mado.models import ApiToken, TokenScope

KEY_PREFIX = "mado_"
PREFIX_LENGTH = 12
LAST_USED_EVERY = timedelta(minutes=1)  # one UPDATE per token a minute, not one per metrics POST


def key_new(head: str = KEY_PREFIX) -> str:
    """A new random key: ``head`` + 43 URL-safe characters (256 bits)."""
    return head + secrets.token_urlsafe(32)


def key_digest(key: str) -> str:
    """The SHA-256 hex digest stored in place of ``key``."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_prefix(key: str) -> str:
    """The first characters of ``key``, stored to find its row (they reveal too little to guess the rest)."""
    return key[:PREFIX_LENGTH]


def row_for_key(queryset, key: str):
    """The row of ``queryset`` (rows with ``prefix`` and ``digest``) whose digest is ``key``'s, or None.

    Rows are found by prefix, then their digests compared in constant time.
    """
    wanted = key_digest(key)
    for row in queryset.filter(prefix=key_prefix(key)):
        if hmac.compare_digest(row.digest, wanted):
            return row
    return None


def refusal(token, now: datetime | None = None) -> str | None:
    """Why a found token (``ApiToken`` or ``RunToken``) is refused now, or None when it is valid."""
    now = now or timezone.now()
    if token.revoked_at is not None and token.revoked_at <= now:  # a future time: revoked then
        return _("This token was revoked.")
    expires_at = getattr(token, "expires_at", None)
    if expires_at is not None and expires_at <= now:
        return _("This token expired: create a new one on your account page.")
    return None


def mark_used(token: ApiToken, address: str | None) -> None:
    """Record that ``token`` was used now from ``address`` (an IP, or None), at most once a minute.

    A conditional UPDATE: concurrent requests write it once and never wait on each other.
    """
    now = timezone.now()
    if token.last_used_ip == address and token.last_used_at is not None and token.last_used_at >= now - LAST_USED_EVERY:
        return  # the row read to authenticate says it is fresh: no query on the hot path
    ApiToken.objects.filter(pk=token.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_EVERY) | ~Q(last_used_ip=address)
    ).update(last_used_at=now, last_used_ip=address)


def _expiry(days: int | None) -> datetime:
    """``days`` from now, the operator's default when None; ``ValidationFailed`` beyond the maximum."""
    default, maximum = settings.MADO_TOKEN_DEFAULT_DAYS, settings.MADO_TOKEN_MAX_DAYS
    days = default if days is None else days
    if not isinstance(days, int) or isinstance(days, bool) or days < 1 or days > maximum:
        raise ValidationFailed(
            _("A token lasts from 1 to %(maximum)d days.") % {"maximum": maximum}, field="expires_in_days"
        )
    return timezone.now() + timedelta(days=days)


@transaction.atomic
def api_token_create(
    *, user, name: str, scope: str = TokenScope.WRITE, expires_in_days: int | None = None, actor=None
) -> tuple[ApiToken, str]:
    """Create ``user``'s token ``name`` (1..100 characters) with ``scope``; returns ``(token, key)``.

    The key is returned this once and never stored (docs/api.md#tokens).
    ``expires_in_days`` None takes the operator's default
    (``MADO_TOKEN_DEFAULT_DAYS``), at most ``MADO_TOKEN_MAX_DAYS``. Raises
    ``ValidationFailed`` (400) for a bad name, scope or lifetime and ``Conflict``
    (409, field ``name``) when an unrevoked token of that name exists. ``actor`` (default ``user``) is who
    the audit log names: a Project admin making a service account's token.
    """
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise ValidationFailed(_("Give the token a name of 1 to 100 characters."), field="name")
    if scope not in TokenScope.values:
        raise ValidationFailed(_("The scope is one of read, write, admin."), field="scope")
    expires_at = _expiry(expires_in_days)
    key = key_new()
    try:
        with transaction.atomic():
            token = ApiToken.objects.create(
                user=user, name=name, scope=scope, prefix=key_prefix(key), digest=key_digest(key), expires_at=expires_at
            )
    except IntegrityError:
        raise Conflict(_("You already have a token named “%(name)s”.") % {"name": name}, field="name") from None
    changes = {"scope": [None, scope], "expires_at": [None, expires_at.isoformat()]}
    audit_record(actor=actor or user, action="token.create", obj=token, changes=changes)
    return token, key


@transaction.atomic
def api_token_revoke(*, user, token_id: int, actor=None) -> ApiToken:
    """Revoke ``user``'s token ``token_id`` now; revoking a revoked token changes nothing (idempotent).

    Raises ``NotFound`` (404) when ``user`` has no such token (another user's included). ``actor`` as in
    ``api_token_create``.
    """
    token = ApiToken.objects.select_for_update().filter(user=user, pk=token_id).first()
    if token is None:
        raise NotFound(_("You have no such token."))
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=token.revoked_at)
        changes = {"revoked_at": [None, token.revoked_at.isoformat()]}
        audit_record(actor=actor or user, action="token.revoke", obj=token, changes=changes)
    return token


def api_token_list(*, user):
    """``user``'s tokens, newest first, revoked ones included (the account page shows them struck out)."""
    return ApiToken.objects.filter(user=user)


RUN_KEY_PREFIX = "mador_"


def run_key_for(salt: str) -> str:
    """The Run token key of ``salt``: an HMAC under the server's secret key, so it can be given again to a retried
    worker without being stored, and a copy of the database alone does not yield it."""
    mac = hmac.new(settings.SECRET_KEY.encode(), f"mado-run-token:{salt}".encode(), hashlib.sha256).digest()
    return RUN_KEY_PREFIX + base64.urlsafe_b64encode(mac).decode().rstrip("=")
