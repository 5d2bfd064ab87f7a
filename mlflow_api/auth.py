"""Authentication of MLflow tracking API requests: ``mado.authentication``'s, in MLflow's error shape
(docs/design/interfaces.md#mlflow; docs/design/runs.md#write-rule).

Bearer/Token (a user token or a Job's Run token) or Basic (password, or a
token as the password), exactly as on ``/api/v1/`` and the artifact API; no
session, no CSRF. A Run token acts only on its own Run (``require_own_run``).
"""

from rest_framework.exceptions import AuthenticationFailed

from mado.authentication import (
    READ_ONLY_TOKEN,
    RUN_TOKEN_SCOPE,
    authenticate_api_request,
    run_id_of,
    run_token_refusal,
    token_may_write,
)
from mlflow_api.errors import PERMISSION_DENIED, UNAUTHENTICATED, MlflowError


def authenticate_request(request, *, run_token_allowed: bool, writes: bool = False):
    """The active user ``request`` authenticates as; ``request.auth`` is set to its credential.

    Raises ``MlflowError`` UNAUTHENTICATED (401) without or with bad
    credentials, PERMISSION_DENIED (403) for a Run token on an endpoint that
    does not act on one Run (``run_token_allowed`` False: creating or
    searching experiments and runs), and for a ``read``-scoped token when the request ``writes``
    (docs/api.md#tokens).
    """
    try:
        found = authenticate_api_request(request)
    except AuthenticationFailed as exc:
        raise MlflowError(UNAUTHENTICATED, str(exc.detail)) from None
    if found is None:
        raise MlflowError(UNAUTHENTICATED, "Authentication required: send a Bearer token or Basic credentials.")
    user, request.auth = found
    if writes and not token_may_write(request.auth):
        raise MlflowError(PERMISSION_DENIED, str(READ_ONLY_TOKEN))
    if not run_token_allowed and run_id_of(request.auth) is not None:
        raise MlflowError(PERMISSION_DENIED, str(RUN_TOKEN_SCOPE))
    return user


def token_run(request):
    """The Run of the request's Run token, or None for a user's credentials."""
    return getattr(request.auth, "run", None) if run_id_of(request.auth) is not None else None


def require_own_project(request, project) -> None:
    """PERMISSION_DENIED (403) when the request's Run token belongs to a Run of another Project than ``project``
    (a Job's code may read its own Run's experiment)."""
    scoped = token_run(request)
    if scoped is not None and scoped.project_id != project.pk:
        raise MlflowError(PERMISSION_DENIED, str(RUN_TOKEN_SCOPE))


def require_own_run(request, run) -> None:
    """PERMISSION_DENIED (403) when the request's Run token belongs to another Run than ``run``."""
    refusal = run_token_refusal(request.auth, run)
    if refusal:
        raise MlflowError(PERMISSION_DENIED, refusal)
