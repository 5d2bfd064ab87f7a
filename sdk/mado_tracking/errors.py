"""Errors raised by the SDK. Everything it raises on purpose is a ``MadoError``.

``ConfigError`` (a setting is missing or malformed) and ``ApiError`` (the
server refused a request, or could not be reached after the retries) are the
two a caller may want to tell apart. Bad arguments (a negative step, a string
metric value) raise the built-in ``ValueError`` instead, at call time.
``CheckpointError`` (a directory that cannot be a checkpoint, a step already
saved) is both a ``MadoError`` and a ``ValueError``; ``ResumeError`` says the
``MMT_RESUME_*`` variables of a resumed run do not fit together.
"""


class MadoError(Exception):
    """Base class of the SDK's own errors."""


class ConfigError(MadoError):
    """A required setting (API URL, token, project) is missing or malformed; the message names it."""


class ApiError(MadoError):
    """An API request failed.

    ``status`` is the HTTP status (``None`` when the server could not be
    reached), ``code`` and ``detail`` come from the API's error body
    ``{"error", "detail", "field"}`` (docs/api.md) and ``field`` names the
    refused field (for example ``points[3].value``) when the server said so.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        detail: str | None = None,
        field: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.code = code
        self.detail = detail
        self.field = field


class CheckpointError(MadoError, ValueError):
    """A checkpoint cannot be saved: the message names the path or step and the reason
    (docs/design/checkpoints.md#a-checkpoint).

    Raised before any byte is uploaded for a symbolic link, an empty
    directory, a non-regular file, a negative step or a step already saved in
    the Run; after an upload when the server refused the tar or its manifest.
    ``field`` is the API's refused field when the server said so.
    """

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


class ResumeError(MadoError):
    """The ``MMT_RESUME_*`` variables (docs/design/worker.md#extract; docs/design/resume.md#in-the-code) are incomplete
    or disagree; the message names them."""
