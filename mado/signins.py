"""Sign-ins audited and throttled (docs/deploy.md#sign-in-throttling).

Throttling is django-axes's, not counters of our own: it is maintained,
counts failures in the database (every web process sees the same count), and
hooks into Django's ``authenticate()`` that the password form, the Django
admin and HTTP Basic on the APIs all go through. After
``MADO_LOGIN_FAILURE_LIMIT`` failures for one account name, or from one
address (``mado.addresses``), further password attempts for it are refused
for ``MADO_LOGIN_LOCKOUT_S`` seconds, the right password too; each attempt
during a lock-out starts the window again, so a guesser who keeps going
stays locked out. Tokens never go through ``authenticate()``: a locked
account's tokens keep working. ``manage.py axes_reset_username NAME`` (or
the Django admin's "Access attempts") unlocks early.

Every sign-in and every refusal is an audit record (``audit_sign_in``):
Django's ``user_logged_in`` and ``user_login_failed`` signals for the form,
the admin and Basic; single sign-on records its own (``runs.oidc``). A
client that sends its password with HTTP Basic on every request (the stock
MLflow client) is recorded once an hour per process, account and address.
"""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.dispatch import receiver
from django.http import JsonResponse
from django.shortcuts import redirect

from mado.addresses import client_address
from mado.audit import audit_sign_in

BASIC_RECORD_EVERY_S = 3600


def _method(request) -> str:
    """``"basic"`` for an ``Authorization: Basic`` request, else ``"password"`` (the form, the admin)."""
    header = request.META.get("HTTP_AUTHORIZATION", "") if request is not None else ""
    return "basic" if header[:6].lower() == "basic " else "password"


def _locked(request) -> bool:
    return bool(getattr(request, "axes_locked_out", False))


@receiver(user_logged_in, dispatch_uid="mado.signins.signed_in")
def _signed_in(sender, request, user, **kwargs):
    if getattr(user, "backend", "").startswith("runs.oidc."):
        return  # single sign-on records its own, with its method
    audit_sign_in(user=user, name=user.get_username(), method=_method(request), result="signed in")


@receiver(user_login_failed, dispatch_uid="mado.signins.refused")
def _refused(sender, credentials, request=None, **kwargs):
    request = getattr(request, "_request", request)  # DRF's Request wraps Django's
    result = "locked out: too many failed attempts" if _locked(request) else "wrong user name or password"
    audit_sign_in(user=None, name=str(credentials.get("username") or "")[:150], method=_method(request), result=result)


def basic_signed_in(request, user) -> None:
    """Record ``user``'s HTTP Basic password sign-in, at most once per ``BASIC_RECORD_EVERY_S`` seconds per
    process, account and address (see above)."""
    key = f"mado:basic-sign-in:{user.pk}:{client_address(request)}"
    if cache.add(key, 1, BASIC_RECORD_EVERY_S):
        audit_sign_in(user=user, name=user.get_username(), method="basic", result="signed in")


def lockout_response(request, original_response=None, credentials=None):
    """What a locked-out attempt gets (django-axes's ``AXES_LOCKOUT_CALLABLE``): 429 with a JSON ``detail`` and
    ``Retry-After`` on the APIs, the login page with the reason on pages."""
    seconds = settings.MADO_LOGIN_LOCKOUT_S
    detail = (
        "Too many failed sign-in attempts for this account or from this address: "
        f"password sign-in is refused for {seconds // 60 or 1} minute(s). Tokens keep working."
    )
    if _method(request) == "basic" or request.path.startswith(("/api/", "/ajax-api/", "/mlflow")):
        response = JsonResponse({"detail": detail}, status=429)
        response["Retry-After"] = str(seconds)
        return response
    messages.error(request, detail)
    return redirect(settings.LOGIN_URL)
