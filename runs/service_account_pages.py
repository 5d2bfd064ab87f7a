"""The members page's service accounts: make one, make or revoke its tokens (docs/api.md#service-accounts)."""

from django.contrib import messages
from django.shortcuts import redirect
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from mado.errors import Conflict, NotFound, ValidationFailed
from runs import service_accounts as services
from runs.views import _administered_project, _members_page, page

SERVICE_ERRORS = (ValidationFailed, Conflict, NotFound)


@page
@require_POST
def service_account_create(request, slug):
    """Make the service account named in the form with its role; back to the members page."""
    project = _administered_project(request, slug)
    try:
        services.service_account_create(
            actor=request.user, project=project, name=request.POST.get("name", ""), role=request.POST.get("role", "")
        )
    except SERVICE_ERRORS as exc:
        return _members_page(request, project, errors=[exc.detail], status=exc.status)
    messages.success(request, _("The service account was made: make a token for it below."))
    return redirect("runs:project-members", slug=project.slug)


@page
@require_POST
def service_account_token_create(request, slug, name):
    """Make a token for the account and show its key on the members page, this once."""
    project = _administered_project(request, slug)
    try:
        account = services.service_account_get(actor=request.user, project=project, name=name)
        _token, key = services.service_account_token_create(
            actor=request.user,
            account=account,
            name=request.POST.get("token_name", ""),
            scope=request.POST.get("scope", ""),
        )
    except SERVICE_ERRORS as exc:
        return _members_page(request, project, errors=[exc.detail], status=exc.status)
    return _members_page(request, project, new_key=key)


@page
@require_POST
def service_account_token_revoke(request, slug, name, token_id: int):
    """Revoke one of the account's tokens; back to the members page."""
    project = _administered_project(request, slug)
    account = services.service_account_get(actor=request.user, project=project, name=name)
    services.service_account_token_revoke(actor=request.user, account=account, token_id=token_id)
    messages.success(request, _("The token was revoked."))
    return redirect("runs:project-members", slug=project.slug)
