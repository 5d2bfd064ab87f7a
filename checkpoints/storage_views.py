"""The Project's Storage page: usage, the retention policy with its preview and apply, and the bulk delete of the
Runs table (docs/design/checkpoints.md#usage, #retention, #deletion). Thin views: a form, one selector or service."""

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect, render
from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from checkpoints.models import RetentionPolicy
from checkpoints.retention import Rules, plan_id, retention_plan
from checkpoints.services import retention as services
from checkpoints.usage import project_usage
from mado import policy
from mado.errors import Conflict, ValidationFailed
from runs import selectors as run_selectors
from runs.models import Run
from runs.views import page


class RetentionPolicyForm(forms.Form):
    keep_last = forms.IntegerField(label=gettext_lazy("Keep the last N per run"), min_value=1, required=False)
    keep_best = forms.IntegerField(label=gettext_lazy("Keep the best K per run"), min_value=1, required=False)
    best_metric = forms.CharField(label=gettext_lazy("by metric"), max_length=250, required=False)
    best_mode = forms.ChoiceField(
        label=gettext_lazy("best is"),
        choices=[("min", gettext_lazy("lowest")), ("max", gettext_lazy("highest"))],
        initial="min",
        required=False,
    )
    keep_every = forms.IntegerField(label=gettext_lazy("Keep every k-th step"), min_value=1, required=False)
    keep_newer_days = forms.IntegerField(
        label=gettext_lazy("Keep everything newer than D days"), min_value=0, required=False
    )
    scheduled = forms.BooleanField(label=gettext_lazy("Apply it every day"), required=False)

    def rules(self) -> Rules:
        data = dict(self.cleaned_data)
        data.pop("scheduled", None)
        data["best_metric"] = data.get("best_metric") or ""
        data["best_mode"] = data.get("best_mode") or "min"
        return Rules(**data)


@page
@require_GET
def project_storage(request, slug):
    """Usage figures for any member; for admins the policy form and, with ``?preview=1``, the preview of the rules
    in the query, or with ``?preview=saved`` of the saved policy: only the latter carries the plan id that the
    Apply button sends."""
    project = run_selectors.project_get_for_user(user=request.user, slug=slug)
    saved = RetentionPolicy.objects.filter(project=project).first()
    is_admin = policy.has_role(request.user, project, policy.ADMIN)
    of_saved = request.GET.get("preview") == "saved" and saved is not None
    data = _initial(saved) if of_saved else request.GET if "preview" in request.GET else None
    form = RetentionPolicyForm(data, initial=_initial(saved))
    plans, refusal, plan = None, None, None
    if is_admin and form.is_bound and form.is_valid():
        try:
            plans = retention_plan(project=project, rules=services.clean_rules(form.rules()))
        except (Conflict, ValidationFailed) as exc:
            refusal = exc.detail
        plan = plan_id(project=project, plans=plans) if of_saved and plans is not None else None
    context = {"project": project, "usage": project_usage(project=project), "policy": saved, "form": form}
    context.update(is_admin=is_admin, plans=plans, refusal=refusal, preview_bytes=sum(p.bytes for p in plans or ()))
    context.update(plan=plan, of_saved=of_saved)
    context["admin_refusal"] = policy.why_not(request.user, project, policy.ADMIN)
    return render(request, "checkpoints/project_storage.html", context)


@page
@require_POST
def project_retention_save(request, slug):
    """Save the policy (admins; ``services.retention_policy_set``); deletes nothing."""
    project = run_selectors.project_get_for_user(user=request.user, slug=slug)
    form = RetentionPolicyForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("The policy was not saved: %(errors)s") % {"errors": form.errors.as_text()})
        return redirect("checkpoints:project-storage", slug=slug)
    try:
        services.retention_policy_set(
            actor=request.user, project=project, rules=form.rules(), scheduled=form.cleaned_data["scheduled"]
        )
    except (Conflict, ValidationFailed) as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, _("The retention policy was saved. Nothing was deleted."))
    return redirect("checkpoints:project-storage", slug=slug)


@page
@require_POST
def project_retention_apply(request, slug):
    """Apply the previewed plan ``plan`` of the saved policy (admins; ``services.retention_apply``): each planned
    checkpoint kept since is named with its reason; a plan that changed deletes nothing and shows the fresh one."""
    project = run_selectors.project_get_for_user(user=request.user, slug=slug)
    try:
        outcome = services.retention_apply(actor=request.user, project=project, plan=request.POST.get("plan", ""))
    except services.PlanChanged:
        messages.error(request, _("The plan changed: review it again. Nothing was deleted."))
        return redirect(reverse("checkpoints:project-storage", args=[slug]) + "?preview=saved")
    except (Conflict, ValidationFailed) as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, _deleted_sentence(outcome))
        for checkpoint, reason in outcome.skipped:
            values = {"step": checkpoint.step, "run": checkpoint.run.name or checkpoint.run_id, "reason": reason}
            messages.warning(request, _("Step %(step)s of run %(run)s was not deleted: %(reason)s") % values)
    return redirect("checkpoints:project-storage", slug=slug)


@page
@require_http_methods(["GET", "POST"])
def project_checkpoints_bulk_delete(request, slug):
    """The Runs table's "Delete checkpoints of selected" (admins): GET (the table's form, which carries no CSRF
    token so none lands in a URL) asks to confirm for the ticked Runs; POST deletes every unprotected checkpoint
    of them (``services.runs_checkpoints_delete``; docs/design/checkpoints.md#deletion)."""
    project = run_selectors.project_get_for_user(user=request.user, slug=slug)
    data = request.POST if request.method == "POST" else request.GET
    run_ids = [int(value) for value in data.getlist("run") if value.isdigit()][:1000]
    if request.method == "GET":
        refusal = policy.why_not(request.user, project, policy.ADMIN)
        if refusal:
            raise PermissionDenied(refusal)
        runs = Run.objects.filter(project=project, pk__in=run_ids).order_by("-pk")
        return render(request, "checkpoints/checkpoints_bulk_delete.html", {"project": project, "runs": runs})
    try:
        outcome = services.runs_checkpoints_delete(actor=request.user, project=project, run_ids=run_ids)
    except (Conflict, ValidationFailed) as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, _deleted_sentence(outcome))
    return redirect("runs:project-detail", slug=slug)


def _initial(saved: RetentionPolicy | None) -> dict:
    if saved is None:
        return {}
    names = ("keep_last", "keep_best", "best_metric", "best_mode", "keep_every", "keep_newer_days", "scheduled")
    return {name: getattr(saved, name) for name in names}


def _deleted_sentence(outcome) -> str:
    return _("%(count)s checkpoints deleted (%(size)s freed); %(kept)s kept by a protection.") % {
        "count": len(outcome.deleted),
        "size": filesizeformat(outcome.bytes),
        "kept": len(outcome.refused),
    }
