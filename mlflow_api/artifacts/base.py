"""The DRF base of the MLflow artifact endpoints, answering in MLflow's error shape (``mlflow_api.errors``;
docs/design/interfaces.md#mlflow).

Authentication is ``mado.authentication``'s, as on ``/api/v1/`` and the
MLflow tracking API: ``Bearer <MLFLOW_TRACKING_TOKEN>`` (a user token or a
Job's Run token) or ``Basic`` with ``MLFLOW_TRACKING_USERNAME`` and the
password or a token as ``MLFLOW_TRACKING_PASSWORD``. No session, so no CSRF
path. Every error is MLflow's ``{"error_code", "message"}`` with the HTTP
status the client expects; anonymous → 401 ``UNAUTHENTICATED``. Views
subclass ``MlflowApiView``.
"""

import logging

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import Http404
from rest_framework import exceptions as drf_exceptions
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from mado.authentication import API_AUTHENTICATION, TokenScopeAllows
from mado.errors import UserError
from mado.outages import outage_of
from mlflow_api.errors import (
    AUTHENTICATE,
    HTTP_STATUS,
    INTERNAL_ERROR,
    INVALID_PARAMETER_VALUE,
    NOT_IMPLEMENTED,
    PERMISSION_DENIED,
    RESOURCE_ALREADY_EXISTS,
    RESOURCE_DOES_NOT_EXIST,
    UNAUTHENTICATED,
    MlflowError,
    error_body,
    from_user_error,
    too_large,
)

logger = logging.getLogger(__name__)


def mlflow_error(code: str, message: str, status: int | None = None) -> Response:
    """MLflow's error body (``mlflow_api.errors``) as a DRF answer; ``status`` defaults to the code's."""
    return Response(error_body(code, message), status=status or HTTP_STATUS.get(code, 400))


def mlflow_exception_handler(exc, context) -> Response | None:
    """Every exception of an MLflow view as ``{"error_code", "message"}``; unexpected ones as 500 ``INTERNAL_ERROR``.

    An outage (database, broker, storage, no space) returns None: DRF re-raises it and
    ``mado.outages.OutageMiddleware`` answers 503 ``TEMPORARILY_UNAVAILABLE`` (or 507).
    """
    if outage_of(exc) is not None:
        return None  # re-raised: mado.outages.OutageMiddleware answers 503 / 507 in MLflow's shape
    if isinstance(exc, (RequestDataTooBig, TooManyFieldsSent)):  # a JSON body over MADO_API_MAX_BODY_BYTES: 413
        exc = too_large(exc)
    if isinstance(exc, UserError):  # the proxy keeps the service's status: 409 RESOURCE_ALREADY_EXISTS for a conflict
        exc = from_user_error(exc, conflict=RESOURCE_ALREADY_EXISTS, keep_status=True)
    if isinstance(exc, MlflowError):
        return mlflow_error(exc.code, exc.message, exc.status)
    if isinstance(exc, Http404):
        return mlflow_error(RESOURCE_DOES_NOT_EXIST, "not found", 404)
    if isinstance(exc, (drf_exceptions.NotAuthenticated, drf_exceptions.AuthenticationFailed)):
        response = mlflow_error(UNAUTHENTICATED, str(exc.detail), 401)
        response["WWW-Authenticate"] = AUTHENTICATE
        return response
    if isinstance(exc, (drf_exceptions.PermissionDenied, DjangoPermissionDenied)):
        return mlflow_error(PERMISSION_DENIED, str(getattr(exc, "detail", "permission denied")), 403)
    if isinstance(exc, drf_exceptions.MethodNotAllowed):
        return mlflow_error(NOT_IMPLEMENTED, str(exc.detail), 405)
    if isinstance(exc, drf_exceptions.APIException):
        return mlflow_error(INVALID_PARAMETER_VALUE, str(exc.detail), exc.status_code)
    logger.exception("MLflow endpoint failed")
    return mlflow_error(INTERNAL_ERROR, "internal error", 500)


class MlflowApiView(APIView):
    """Base of the MLflow endpoints: Bearer or Basic auth, no session, MLflow's JSON errors.

    A Run token may be used; a view must check it acts on the token's own
    Run (``mlflow_api.auth.require_own_run``), as ``RunTokenScope`` does for ``/api/v1/``.
    """

    authentication_classes = list(API_AUTHENTICATION)
    permission_classes = [IsAuthenticated, TokenScopeAllows]
    renderer_classes = [JSONRenderer]
    schema = None  # MLflow's own protocol, not part of mado's /api/v1/ OpenAPI schema

    def get_exception_handler(self):
        return mlflow_exception_handler
