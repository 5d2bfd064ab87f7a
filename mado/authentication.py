"""One authentication for ``/api/v1/``, the MLflow tracking API and the MLflow artifact API
(docs/design/interfaces.md#mlflow; docs/design/runs.md#write-rule).

Accepted everywhere alike:

- ``Authorization: Bearer <token>`` (or DRF's ``Token <token>``): a user's
  API token (``manage.py mado_token``) or a Job's Run token (``MMT_API_TOKEN``);
- ``Authorization: Basic`` ``username:password`` or ``username:<token>`` (the
  stock MLflow client's ``MLFLOW_TRACKING_USERNAME`` / ``PASSWORD``): the
  user's password, or one of that user's tokens as the password;
- pages (and the browsable API) use Django's session, with CSRF on writes.

A user token acts as its user. A Run token acts as the Job's creator (who
created the Run) with ``request.auth`` set to the token, and is scoped to its
Run: ``run_token_refusal`` is that rule, ``RunTokenScope`` applies it to the
DRF views and the MLflow views call it with the Run they act on. This module
imports no app: the jobs app registers how a Run token is found
(``register_token_lookup``) in its ``AppConfig.ready()``.
"""

from collections.abc import Callable

from django.contrib.auth import authenticate
from django.utils.translation import gettext_lazy as _
from rest_framework.authentication import BaseAuthentication, BasicAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import SAFE_METHODS, BasePermission

from mado.addresses import client_address

RUN_TOKEN_SCOPE = _("This token belongs to one run and may only act on that run.")
READ_ONLY_TOKEN = _("This token may only read: create a token with the write scope to change anything.")
INVALID_TOKEN = "Invalid token."
INVALID_BASIC = "Invalid username or password."

# key -> (user, credential) or None; the jobs app registers the Run token lookup.
_token_lookups: list[Callable[[str], tuple | None]] = []


def register_token_lookup(lookup: Callable[[str], tuple | None]) -> None:
    """Also accept the tokens ``lookup(key)`` finds: it returns ``(user, credential)``, or None when ``key`` is
    not one of its tokens, and raises ``AuthenticationFailed`` for one it refuses (e.g. revoked)."""
    if lookup not in _token_lookups:
        _token_lookups.append(lookup)


def user_for_token(key: str, request=None) -> tuple:
    """``(user, credential)`` for an API token ``key`` (a user's ``ApiToken``, or a registered kind such as a Run
    token); ``request`` (or None) gives the address recorded as the token's last use.

    Raises ``AuthenticationFailed`` (401): unknown key, revoked or expired
    token, inactive user (docs/api.md#tokens). The user's role is limited to the
    token's scope for this request (``mado.policy.limit_to_scope``).
    """
    # models: importable only once the apps are loaded; the policy imports DRF, whose settings import this module
    from mado import tokens
    from mado.audit import remember_credential
    from mado.models import ApiToken
    from mado.policy import limit_to_scope

    token = tokens.row_for_key(ApiToken.objects.select_related("user"), key)
    found = None
    if token is not None:
        reason = tokens.refusal(token)
        if reason:
            raise AuthenticationFailed(reason)
        tokens.mark_used(token, client_address(request))
        found = (token.user, token)
    for lookup in _token_lookups:
        found = found or lookup(key)
    if found is None:
        raise AuthenticationFailed(INVALID_TOKEN)
    if not found[0].is_active:
        raise AuthenticationFailed("User inactive or deleted.")
    limit_to_scope(found[0], getattr(found[1], "scope", None))
    remember_credential(found[0], found[1])
    return found


def run_id_of(credential) -> int | None:
    """The id of the Run a Run token is scoped to; None for any other credential (a user token, a session)."""
    return getattr(credential, "run_id", None)


def run_token_refusal(credential, run) -> str | None:
    """None when ``credential`` may act on ``run``; the sentence for a 403 when it is a Run token of another Run
    (``run`` None: something of no Run, such as a logged model made outside one, which no Run token reaches)."""
    scoped = run_id_of(credential)
    return None if scoped is None or (run is not None and scoped == run.pk) else str(RUN_TOKEN_SCOPE)


class BearerTokenAuthentication(BaseAuthentication):
    """``Authorization: Bearer <token>`` or ``Token <token>`` with a user token or a Run token."""

    keywords = ("bearer", "token")

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        scheme, _sep, token = header.partition(" ")
        if scheme.lower() not in self.keywords:
            return None
        token = token.strip()
        if not token or " " in token:
            raise AuthenticationFailed("Invalid token header: expected 'Bearer <token>'.")
        return user_for_token(token, request)

    def authenticate_header(self, request):
        return "Bearer"


class PasswordOrTokenBasicAuthentication(BasicAuthentication):
    """``Authorization: Basic``: the user's password, or one of the user's tokens as the password."""

    def authenticate_credentials(self, userid, password, request=None):
        """``(user, credential)`` for a token of that user, ``(user, None)`` for the right password; else 401.

        The token is tried first: a database lookup, where a password costs a
        deliberately slow hash on every request of the MLflow client.
        """
        try:
            return self._checked(userid, *user_for_token(password, request))
        except AuthenticationFailed:
            pass
        from mado.signins import basic_signed_in  # imports models: not at this module's import (see above)

        # Django's request, where django-axes notes a lock-out for its middleware to answer 429 (mado.signins).
        http_request = getattr(request, "_request", request)
        user = self._checked(userid, authenticate(request=http_request, username=userid, password=password), None)[0]
        basic_signed_in(http_request, user)
        return user, None

    @staticmethod
    def _checked(userid, user, credential) -> tuple:
        if user is None or not user.is_active or user.get_username() != userid:
            raise AuthenticationFailed(INVALID_BASIC)
        return user, credential

    def authenticate_header(self, request):
        return 'Basic realm="mado"'


API_AUTHENTICATION = (BearerTokenAuthentication, PasswordOrTokenBasicAuthentication)


def authenticate_api_request(request) -> tuple | None:
    """``(user, credential)`` from the request's ``Authorization`` header (Bearer, Token or Basic), None without one.

    For the MLflow views that are plain Django views; DRF views list
    ``API_AUTHENTICATION`` instead. Raises ``AuthenticationFailed`` for bad
    credentials.
    """
    for authentication in API_AUTHENTICATION:
        found = authentication().authenticate(request)
        if found is not None:
            return found
    return None


class RunTokenScope(BasePermission):
    """A request authenticated by a Run token may only act on that Run (docs/api.md); others pass through.

    Allowed for a Run token of Run R: any view whose URL names R (``run_id``,
    or ``pk`` of ``runs/{id}/``) or one of R's checkpoints
    (``checkpoint_id``; R's source checkpoint too, read-only); ``POST runs/`` naming R's project and external id
    (the SDK attaching to its pre-created Run); ``GET runs/`` filtered by R's
    external id (the SDK finding it again after a retry). Everything else
    answers 403, and so does a view with ``run_token_allowed = False`` (a
    command that starts Jobs, e.g. ``checkpoints/{id}/resume/``): a Job's
    code never launches Jobs with its token.
    """

    message = RUN_TOKEN_SCOPE

    def has_permission(self, request, view) -> bool:
        if run_id_of(request.auth) is None:
            return True
        if not getattr(view, "run_token_allowed", True):
            return False
        run = request.auth.run
        kwargs = getattr(view, "kwargs", {}) or {}
        if "run_id" in kwargs:
            return str(kwargs["run_id"]) == str(run.pk)
        if "checkpoint_id" in kwargs:
            return self._own_checkpoint(run, kwargs["checkpoint_id"], read=request.method in SAFE_METHODS)
        if getattr(view, "basename", None) != "run":
            return False
        if "pk" in kwargs:
            return str(kwargs["pk"]) == str(run.pk)
        if request.method == "POST":
            return self._names_run(run, request.data)
        if request.method == "GET":
            return request.query_params.get("external_id") == run.external_id and self._same_project(
                run, request.query_params.get("project")
            )
        return False

    @staticmethod
    def _own_checkpoint(run, checkpoint_id, *, read: bool) -> bool:
        try:
            checkpoint_id = int(checkpoint_id)
        except (TypeError, ValueError):
            return False
        if read and checkpoint_id == run.source_checkpoint_id:
            return True  # the checkpoint the Run resumes from: readable (metadata, tar), never writable
        return run.checkpoints.filter(pk=checkpoint_id).exists()

    @staticmethod
    def _same_project(run, slug) -> bool:
        return slug in (None, "", run.project.slug)

    @classmethod
    def _names_run(cls, run, data) -> bool:
        if not hasattr(data, "get"):
            return False
        return data.get("external_id") == run.external_id and data.get("project") == run.project.slug


def token_may_write(credential) -> bool:
    """False for a ``read``-scoped token (docs/api.md#tokens); True for other tokens, a password or a session."""
    return getattr(credential, "scope", None) != "read"


class TokenScopeAllows(BasePermission):
    """A ``read``-scoped token only reads (safe methods, or a view with ``token_read_only = True`` whose POST only
    reads, e.g. a search): every other request answers 403 (docs/api.md#tokens)."""

    message = READ_ONLY_TOKEN

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS or getattr(view, "token_read_only", False):
            return True
        return token_may_write(request.auth)
