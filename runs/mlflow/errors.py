"""MLflow's error shape ``{"error_code", "message"}`` and the HTTP codes the MLflow client expects."""

from django.http import JsonResponse

from mado.errors import Conflict, Forbidden, NotFound, UserError, ValidationFailed

INVALID_PARAMETER_VALUE = "INVALID_PARAMETER_VALUE"
RESOURCE_DOES_NOT_EXIST = "RESOURCE_DOES_NOT_EXIST"
RESOURCE_ALREADY_EXISTS = "RESOURCE_ALREADY_EXISTS"
PERMISSION_DENIED = "PERMISSION_DENIED"
UNAUTHENTICATED = "UNAUTHENTICATED"
INVALID_STATE = "INVALID_STATE"
ENDPOINT_NOT_FOUND = "ENDPOINT_NOT_FOUND"

HTTP_STATUS = {
    INVALID_PARAMETER_VALUE: 400,
    RESOURCE_ALREADY_EXISTS: 400,
    INVALID_STATE: 400,
    RESOURCE_DOES_NOT_EXIST: 404,
    ENDPOINT_NOT_FOUND: 404,
    PERMISSION_DENIED: 403,
    UNAUTHENTICATED: 401,
}


class MlflowError(Exception):
    """A user error with an MLflow error code; rendered by ``error_response``."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def from_user_error(exc: UserError) -> MlflowError:
    """Translate a mado service error (``mado.errors``) into its MLflow equivalent."""
    message = f"{exc.field}: {exc.detail}" if exc.field else str(exc.detail)
    if isinstance(exc, NotFound):
        return MlflowError(RESOURCE_DOES_NOT_EXIST, message)
    if isinstance(exc, Forbidden):
        return MlflowError(PERMISSION_DENIED, message)
    if isinstance(exc, Conflict):
        return MlflowError(INVALID_STATE, message)
    if isinstance(exc, ValidationFailed):
        return MlflowError(INVALID_PARAMETER_VALUE, message)
    return MlflowError(INVALID_PARAMETER_VALUE, message)


def error_response(exc: MlflowError) -> JsonResponse:
    """The JSON answer for ``exc`` (never an HTML page); 401 also names the accepted schemes."""
    response = JsonResponse({"error_code": exc.code, "message": exc.message}, status=HTTP_STATUS.get(exc.code, 400))
    if exc.code == UNAUTHENTICATED:
        response["WWW-Authenticate"] = 'Bearer realm="mado", Basic realm="mado"'
    return response
