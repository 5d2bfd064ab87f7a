"""API authentication: user tokens and Run tokens, ``Authorization: Bearer <token>`` (or ``Token <token>``).

A user token (``manage.py mado_token``) acts as its user everywhere the user
may act. A Run token (``jobs.models.RunToken``, the ``MMT_API_TOKEN`` a Job's
code gets) authenticates as the Job's creator with ``request.auth`` set to
the ``RunToken``, and ``RunTokenScope`` — the one place that rule lives, in
``DEFAULT_PERMISSION_CLASSES`` — lets it act only on its own Run.
"""

from django.utils.translation import gettext_lazy as _
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import SAFE_METHODS, BasePermission


class BearerTokenAuthentication(TokenAuthentication):
    """DRF token auth that also accepts the ``Bearer`` keyword and Run tokens (ARCHITECTURE: API auth)."""

    keywords = ("bearer", "token")

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        scheme, _sep, token = header.partition(" ")
        if scheme.lower() not in self.keywords:
            return None
        token = token.strip()
        if not token or " " in token:
            raise AuthenticationFailed("Invalid token header: expected 'Bearer <token>'.")
        return self.authenticate_credentials(token)

    def authenticate_credentials(self, key):
        """``(user, Token)`` for a user token, ``(user, RunToken)`` for an active Run token; else 401."""
        model = self.get_model()
        token = model.objects.select_related("user").filter(key=key).first()
        if token is None:
            return self._run_token(key)
        if not token.user.is_active:
            raise AuthenticationFailed("User inactive or deleted.")
        return token.user, token

    @staticmethod
    def _run_token(key):
        from jobs.models import RunToken

        token = RunToken.objects.select_related("user", "run__project").filter(key=key).first()
        if token is None:
            raise AuthenticationFailed("Invalid token.")
        if token.revoked_at is not None:
            raise AuthenticationFailed("This run token was revoked: its Job has ended.")
        if not token.user.is_active:
            raise AuthenticationFailed("User inactive or deleted.")
        return token.user, token

    def authenticate_header(self, request):
        return "Bearer"


class RunTokenScope(BasePermission):
    """A request authenticated by a Run token may only act on that Run (docs/jobs.md); others pass through.

    Allowed for a Run token of Run R: any view whose URL names R (``run_id``,
    or ``pk`` of ``runs/{id}/``) or one of R's checkpoints
    (``checkpoint_id``; R's source checkpoint too, read-only); ``POST runs/`` naming R's project and external id
    (the SDK attaching to its pre-created Run); ``GET runs/`` filtered by R's
    external id (the SDK finding it again after a retry). Everything else
    answers 403, and so does a view with ``run_token_allowed = False`` (a
    command that starts Jobs, e.g. ``checkpoints/{id}/resume/``): a Job's
    code never launches Jobs with its token.
    """

    message = _("This token belongs to one run and may only act on that run.")

    def has_permission(self, request, view) -> bool:
        from jobs.models import RunToken

        token = request.auth
        if not isinstance(token, RunToken):
            return True
        if not getattr(view, "run_token_allowed", True):
            return False
        run = token.run
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
        from checkpoints.models import Checkpoint

        try:
            checkpoint_id = int(checkpoint_id)
        except (TypeError, ValueError):
            return False
        if read and checkpoint_id == run.source_checkpoint_id:
            return True  # the checkpoint the Run resumes from: readable (metadata, tar), never writable
        return Checkpoint.objects.filter(pk=checkpoint_id, run_id=run.pk).exists()

    @staticmethod
    def _same_project(run, slug) -> bool:
        return slug in (None, "", run.project.slug)

    @classmethod
    def _names_run(cls, run, data) -> bool:
        if not hasattr(data, "get"):
            return False
        return data.get("external_id") == run.external_id and data.get("project") == run.project.slug
