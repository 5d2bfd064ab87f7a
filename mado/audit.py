"""The audit log (docs/api.md#audit): who changed who may do what, or ended, resumed, deleted or changed a Run,
Job, Checkpoint, Artifact, Project, membership or token — recorded once, by the service that made the change.

Services call ``audit_record`` inside their transaction, so a record exists
exactly when the change committed. The request's address and id come from
``AuditContextMiddleware``; the credential (a token, a Run token) from
``remember_credential``, which ``mado.authentication`` calls. Other apps may
react to each record through ``audit_recorded`` (alert rules connect to it).
"""

import contextvars
import uuid

from django.db import transaction
from django.dispatch import Signal

from mado.addresses import client_address
from mado.models import ActorKind, AuditEvent
from mado.policy import is_service_account

# Sent on commit with ``event`` (an ``AuditEvent``): the hook for alert rules and other reactions.
audit_recorded = Signal()

_request = contextvars.ContextVar("mado_audit_request", default=None)
_CREDENTIAL = "_audit_credential"  # on the user instance of a request: what it authenticated with


def remember_credential(user, credential) -> None:
    """Note on ``user`` (this request's instance) the credential it came with: an ``ApiToken``, a Run token, None."""
    user.__dict__[_CREDENTIAL] = credential


def _actor(actor) -> dict:
    """The actor columns for ``actor`` (a user, or None for the system: a periodic task, a command)."""
    if actor is None or not getattr(actor, "is_authenticated", False):
        return {"actor_kind": ActorKind.SYSTEM, "actor_id": None, "actor_name": "", "via": ""}
    credential = actor.__dict__.get(_CREDENTIAL)
    kind, via = ActorKind.USER, ""
    if getattr(credential, "run_id", None) is not None:
        kind, via = ActorKind.RUN_TOKEN, f"run token of run {credential.run_id}"
    elif credential is not None and hasattr(credential, "scope"):
        via = f"token “{credential.name}” ({credential.scope})"
    if is_service_account(actor):
        kind = ActorKind.SERVICE_ACCOUNT
    return {"actor_kind": kind, "actor_id": actor.pk, "actor_name": actor.get_username(), "via": via}


def audit_record(
    *,
    actor,
    action: str,
    obj=None,
    object_type: str = "",
    object_id="",
    object_repr: str = "",
    project_id: int | None = None,
    changes: dict | None = None,
) -> AuditEvent:
    """Append one record: ``actor`` (a user or None) did ``action`` (``"<entity>.<verb>"``) to ``obj`` (a model
    instance, or described by ``object_type`` / ``object_id`` / ``object_repr``) of Project ``project_id``,
    changing ``changes`` (``{field: [before, after]}``). Call inside the service's transaction."""
    if obj is not None:
        object_type = object_type or obj._meta.label_lower
        object_id = object_id or obj.pk
        object_repr = object_repr or str(obj)
    context = _request.get() or {}
    event = AuditEvent.objects.create(
        **_actor(actor),
        action=action,
        object_type=object_type,
        object_id=str(object_id if object_id is not None else ""),
        object_repr=str(object_repr)[:200],
        project_id=project_id,
        changes=changes or {},
        address=context.get("address"),
        request_id=context.get("request_id", ""),
    )
    transaction.on_commit(lambda: audit_recorded.send(sender=AuditEvent, event=event))
    return event


def audit_sign_in(*, user, name: str, method: str, result: str) -> AuditEvent:
    """Record one sign-in attempt (docs/api.md#audit): by ``user`` (None when nobody signed in; ``name`` is then
    the name tried), through ``method`` (``"password"``, ``"basic"``, ``"oidc"``), ``result`` ``"signed in"`` or
    the reason it was refused."""
    return audit_record(
        actor=user,
        action="auth.sign_in" if user is not None else "auth.sign_in_failed",
        object_type="auth.user",
        object_id=user.pk if user is not None else "",
        object_repr=name,
        changes={"method": [None, method], "result": [None, result[:200]]},
    )


class AuditContextMiddleware:
    """Keeps the request's address for the records its services write; the request id is the one
    ``mado.logs.RequestIdMiddleware`` gave the request (and answered in ``X-Request-ID``)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request_id = getattr(request, "request_id", "") or uuid.uuid4().hex
        token = _request.set({"address": client_address(request), "request_id": request_id})
        try:
            return self.get_response(request)
        finally:
            _request.reset(token)
