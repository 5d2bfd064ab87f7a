"""Authentication of MLflow API requests: Bearer token or HTTP Basic, no session, no CSRF (issue 7 part 3).

- ``Authorization: Bearer <token>`` (``MLFLOW_TRACKING_TOKEN``) or ``Token <token>``:
  the user's API token, as on ``/api/v1/``.
- ``Authorization: Basic`` (``MLFLOW_TRACKING_USERNAME`` / ``PASSWORD``): the
  user's password, or the user's API token as the password.

Run tokens (a Job's ``MMT_API_TOKEN``) are refused here: they are scoped to
one Run, and the MLflow API can create experiments and runs.
"""

import base64
import binascii

from django.contrib.auth import authenticate
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import AuthenticationFailed

from mado.authentication import BearerTokenAuthentication
from runs.mlflow.errors import PERMISSION_DENIED, UNAUTHENTICATED, MlflowError


def authenticate_request(request):
    """The active user that ``request`` authenticates as; ``MlflowError`` UNAUTHENTICATED (401) otherwise."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _sep, credentials = header.partition(" ")
    scheme = scheme.lower()
    if scheme in ("bearer", "token"):
        return _token_user(credentials.strip())
    if scheme == "basic":
        return _basic_user(request, credentials.strip())
    raise MlflowError(UNAUTHENTICATED, "Authentication required: send a Bearer token or Basic credentials.")


def _token_user(key: str):
    if not key or " " in key:
        raise MlflowError(UNAUTHENTICATED, "Invalid token header: expected 'Bearer <token>'.")
    try:
        user, token = BearerTokenAuthentication().authenticate_credentials(key)
    except AuthenticationFailed as exc:
        raise MlflowError(UNAUTHENTICATED, str(exc.detail)) from None
    if not isinstance(token, Token):
        raise MlflowError(PERMISSION_DENIED, "A run token cannot be used with the MLflow API; use a user token.")
    return user


def _basic_user(request, credentials: str):
    try:
        decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise MlflowError(UNAUTHENTICATED, "Invalid Basic credentials.") from None
    username, sep, password = decoded.partition(":")
    if not sep or not username:
        raise MlflowError(UNAUTHENTICATED, "Invalid Basic credentials.")
    user = authenticate(request, username=username, password=password)
    if user is None:
        token = Token.objects.select_related("user").filter(key=password, user__username=username).first()
        user = token.user if token else None
    if user is None or not user.is_active:
        raise MlflowError(UNAUTHENTICATED, "Invalid username or password.")
    return user
