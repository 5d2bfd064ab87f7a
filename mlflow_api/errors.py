"""MLflow's error shape, one definition for the tracking API, the artifact proxy and outages
(docs/design/interfaces.md#mlflow).

Every MLflow error answers ``{"error_code": code, "message": message}`` with
the HTTP status the stock client expects for the code (``HTTP_STATUS``);
401 also names the accepted schemes. ``MlflowError`` carries a code, a
message and that status; ``from_user_error`` translates a mado service
error (``mado.errors``); ``too_large`` a body over ``MADO_API_MAX_BODY_BYTES`` (413).
"""

from django.conf import settings
from django.core.exceptions import TooManyFieldsSent
from django.http import JsonResponse

from mado.errors import Conflict, Forbidden, NotFound, UserError

INVALID_PARAMETER_VALUE = "INVALID_PARAMETER_VALUE"
RESOURCE_DOES_NOT_EXIST = "RESOURCE_DOES_NOT_EXIST"
RESOURCE_ALREADY_EXISTS = "RESOURCE_ALREADY_EXISTS"
PERMISSION_DENIED = "PERMISSION_DENIED"
UNAUTHENTICATED = "UNAUTHENTICATED"
INVALID_STATE = "INVALID_STATE"
ENDPOINT_NOT_FOUND = "ENDPOINT_NOT_FOUND"
NOT_IMPLEMENTED = "NOT_IMPLEMENTED"
INTERNAL_ERROR = "INTERNAL_ERROR"

HTTP_STATUS = {
    INVALID_PARAMETER_VALUE: 400,
    RESOURCE_ALREADY_EXISTS: 400,
    INVALID_STATE: 400,
    RESOURCE_DOES_NOT_EXIST: 404,
    ENDPOINT_NOT_FOUND: 404,
    PERMISSION_DENIED: 403,
    UNAUTHENTICATED: 401,
    NOT_IMPLEMENTED: 501,
    INTERNAL_ERROR: 500,
}
AUTHENTICATE = 'Bearer realm="mado", Basic realm="mado"'


class MlflowError(Exception):
    """An MLflow error: ``code`` (one of the names above), ``message``, and the HTTP ``status``
    (default: the code's in ``HTTP_STATUS``, 400 for any other code)."""

    def __init__(self, code: str, message: str, *, status: int | None = None):
        super().__init__(message)
        self.code, self.message = code, message
        self.status = status or HTTP_STATUS.get(code, 400)


def from_user_error(exc: UserError, *, conflict: str = INVALID_STATE, keep_status: bool = False) -> MlflowError:
    """A mado service error (``mado.errors``) as an MLflow error.

    NotFound → RESOURCE_DOES_NOT_EXIST, Forbidden → PERMISSION_DENIED,
    Conflict → ``conflict`` (the tracking API: INVALID_STATE; the artifact
    proxy: RESOURCE_ALREADY_EXISTS), anything else INVALID_PARAMETER_VALUE.
    The message names the field when the error has one. ``keep_status``:
    answer the service error's own HTTP status (409 for a conflict) instead
    of the code's.
    """
    message = f"{exc.field}: {exc.detail}" if exc.field else str(exc.detail)
    if isinstance(exc, NotFound):
        code = RESOURCE_DOES_NOT_EXIST
    elif isinstance(exc, Forbidden):
        code = PERMISSION_DENIED
    elif isinstance(exc, Conflict):
        code = conflict
    else:
        code = INVALID_PARAMETER_VALUE
    return MlflowError(code, message, status=exc.status if keep_status else None)


def too_large(exc: Exception) -> MlflowError:
    """A request body (or its form fields) over what the API reads into memory (``MADO_API_MAX_BODY_BYTES``,
    Django's ``RequestDataTooBig`` / ``TooManyFieldsSent``) as 413 ``INVALID_PARAMETER_VALUE`` naming the limit:
    MLflow's own server answers a body over its limit 413 too, and the stock client does not retry a 413."""
    if isinstance(exc, TooManyFieldsSent):
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        return MlflowError(INVALID_PARAMETER_VALUE, f"the request sends more than {limit} form fields", status=413)
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return MlflowError(
        INVALID_PARAMETER_VALUE,
        f"the request body is larger than {limit} bytes (MADO_API_MAX_BODY_BYTES), the most the API reads at once; "
        "send less at a time (log_batch: fewer metrics, params or tags per call)",
        status=413,
    )


def error_body(code: str, message: str) -> dict:
    """MLflow's JSON error body."""
    return {"error_code": code, "message": message}


def error_response(exc: MlflowError) -> JsonResponse:
    """The JSON answer for ``exc`` (never an HTML page); 401 also names the accepted schemes."""
    response = JsonResponse(error_body(exc.code, exc.message), status=exc.status)
    if exc.code == UNAUTHENTICATED:
        response["WWW-Authenticate"] = AUTHENTICATE
    return response
