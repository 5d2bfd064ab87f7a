"""The account page's tokens: list, create (the key shown once) and revoke (docs/api.md#tokens)."""

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy as _lazy
from django.views.decorators.http import require_http_methods, require_POST

from mado import tokens
from mado.errors import Conflict, NotFound, ValidationFailed
from mado.models import TokenScope

SCOPE_HELP = _lazy("read: reads only; write: also logs runs and launches jobs; admin: also what project admins do.")


class TokenCreateForm(forms.Form):
    name = forms.CharField(label=_lazy("Name"), max_length=100)
    scope = forms.ChoiceField(
        label=_lazy("Scope"), choices=TokenScope.choices, initial=TokenScope.WRITE, help_text=SCOPE_HELP
    )
    expires_in_days = forms.IntegerField(label=_lazy("Expires in (days)"), min_value=1)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["expires_in_days"].initial = settings.MADO_TOKEN_DEFAULT_DAYS
        self.fields["expires_in_days"].max_value = settings.MADO_TOKEN_MAX_DAYS


@login_required
@require_http_methods(["GET", "POST"])
def token_list(request):
    """GET: the user's tokens and a form; POST: create one and show its key this once (never again)."""
    form, key, status = TokenCreateForm(request.POST or None), None, 200
    if request.method == "POST" and form.is_valid():
        try:
            _token, key = tokens.api_token_create(user=request.user, **form.cleaned_data)
            form = TokenCreateForm()
        except (ValidationFailed, Conflict) as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.detail)
            status = exc.status
    elif request.method == "POST":
        status = 400
    context = {"form": form, "key": key, "tokens": tokens.api_token_list(user=request.user)}
    return render(request, "mado/token_list.html", context, status=status)


@login_required
@require_POST
def token_revoke(request, token_id: int):
    """Revoke one of the user's tokens; another user's is 404."""
    try:
        token = tokens.api_token_revoke(user=request.user, token_id=token_id)
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    messages.success(request, _("The token “%(name)s” was revoked.") % {"name": token.name})
    return redirect("token-list")
