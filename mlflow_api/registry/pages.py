"""Pages of the model registry: a Project's models, one model's versions and aliases, and "Register as model
version" on a checkpoint's row (docs/api.md#model-registry).

Each view fetches through a selector (another Project's object is a 404),
calls at most one service and renders or redirects; who may register comes
from ``mado.policy`` (members), the service checks again.
"""

from django import forms
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET, require_http_methods

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


@page
@require_GET
def model_detail(request, pk):
    """One registered model: its aliases and every version with its source Run, logged model and checkpoint."""
    model = RegisteredModel.objects.visible_to(request.user).filter(pk=pk, project__isnull=False).first()
    if model is None:
        raise Http404("model not found")
    (model,) = selectors.registered_model_list_for_project(project=model.project, pks=[model.pk])
    return render(request, "registry/model_detail.html", {"project": model.project, "model": model})


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
