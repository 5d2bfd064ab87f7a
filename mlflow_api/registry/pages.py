"""Pages of the model registry: a Project's models, one model's versions and aliases (a Project admin sets and
removes aliases and deletes versions there), and "Register as model version" on a checkpoint's row
(docs/api.md#model-registry).

Each view fetches through a selector (another Project's object is a 404),
calls at most one service and renders or redirects; who may register comes
from ``mado.policy`` (members), the service checks again.
"""

from django import forms
from django.contrib import messages
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from checkpoints.selectors import checkpoint_get_for_user
from mado import policy
from mado.errors import Conflict, Forbidden
from mlflow_api.errors import MlflowError
from mlflow_api.models import RegisteredModel
from mlflow_api.registry import selectors, services
from runs.selectors import project_get_for_user
from runs.views import page


class RegisterForm(forms.Form):
    name = forms.CharField(
        label=gettext_lazy("Model name"),
        max_length=services.NAME_MAX,
        help_text=gettext_lazy("An existing model of this project gets a new version; a new name makes a new model."),
    )
    description = forms.CharField(
        label=gettext_lazy("Description"), required=False, max_length=services.DESCRIPTION_MAX, widget=forms.Textarea
    )


@page
@require_GET
def model_list(request, slug):
    """A Project's registered models: each model's versions (newest first) with aliases, source Run and
    checkpoint."""
    project = project_get_for_user(user=request.user, slug=slug)
    models = selectors.registered_model_list_for_project(project=project)
    return render(request, "registry/model_list.html", {"project": project, "models": models})


def _model(request, pk) -> RegisteredModel:
    """The registered model ``pk`` of one of the user's Projects, else 404."""
    model = RegisteredModel.objects.visible_to(request.user).filter(pk=pk, project__isnull=False).first()
    if model is None:
        raise Http404("model not found")
    return model


@page
@require_GET
def model_detail(request, pk):
    """One registered model: its aliases and every version with its source Run, logged model and checkpoint; a
    Project admin also gets the forms that set and remove aliases and delete versions."""
    model = _model(request, pk)
    (model,) = selectors.registered_model_list_for_project(project=model.project, pks=[model.pk])
    is_admin = policy.has_role(request.user, model.project, policy.ADMIN)
    return render(
        request, "registry/model_detail.html", {"project": model.project, "model": model, "is_admin": is_admin}
    )


@page
@require_POST
def alias_set(request, pk):
    """Point the alias of the form (``alias``) at version ``version`` (``services.model_alias_set``, Project
    admins); back to the model's page, saying what happened or why it was refused."""
    model = _model(request, pk)
    alias = request.POST.get("alias", "").strip()
    raw = request.POST.get("version", "")
    version = model.versions.filter(version=int(raw)).first() if raw.isdigit() and len(raw) <= 9 else None
    if version is None:
        messages.error(request, _("Choose one of the model's versions."))
        return redirect("registry:model-detail", model.pk)
    try:
        services.model_alias_set(actor=request.user, model=model, alias=alias, version=version)
    except MlflowError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(
            request, _("@%(alias)s now loads version %(version)s.") % {"alias": alias, "version": version.version}
        )
    return redirect("registry:model-detail", model.pk)


@page
@require_POST
def alias_delete(request, pk, alias):
    """Remove ``alias`` (``services.model_alias_delete``, Project admins); back to the model's page."""
    model = _model(request, pk)
    try:
        services.model_alias_delete(actor=request.user, model=model, alias=alias)
    except MlflowError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, _("@%(alias)s was removed.") % {"alias": alias})
    return redirect("registry:model-detail", model.pk)


@page
@require_POST
def version_delete(request, pk, version):
    """Delete version ``version`` and its aliases (``services.model_version_delete``, Project admins; the form
    sends ``confirm=1``, else 400): its checkpoint becomes deletable unless another version holds it."""
    model = _model(request, pk)
    row = model.versions.filter(version=version).first()
    if row is None:
        raise Http404("version not found")
    if request.POST.get("confirm") != "1":
        return HttpResponseBadRequest(_("Confirm the deletion (confirm=1)."))
    services.model_version_delete(actor=request.user, version=row)
    messages.success(request, _("Version %(version)s was deleted.") % {"version": version})
    return redirect("registry:model-detail", model.pk)


@page
@require_http_methods(["GET", "POST"])
def checkpoint_register(request, pk):
    """GET: the form (or why the user may not register); POST: ``services.checkpoint_register``, then the model's
    page. A refusal (not complete, a name that cannot be used) is shown on the form."""
    checkpoint = checkpoint_get_for_user(user=request.user, checkpoint_id=pk)
    refusal = policy.why_not(request.user, checkpoint.run.project, policy.MEMBER)
    form = RegisterForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and not refusal and form.is_valid():
        try:
            version = services.checkpoint_register(actor=request.user, checkpoint=checkpoint, **form.cleaned_data)
        except (MlflowError, Conflict) as exc:
            form.add_error("name", getattr(exc, "message", None) or exc.detail)
        else:
            messages.success(
                request,
                _("The checkpoint at step %(step)s is version %(version)s of model %(name)s.")
                % {"step": checkpoint.step, "version": version.version, "name": version.registered_model.name},
            )
            return redirect("registry:model-detail", version.registered_model_id)
    elif request.method == "POST" and refusal:
        raise Forbidden(refusal)
    context = {"checkpoint": checkpoint, "run": checkpoint.run, "form": form, "refusal": refusal}
    return render(request, "registry/checkpoint_register.html", context)
