"""Pages of Sweeps: a Project's sweeps, the "New sweep" form and a Sweep with its trials
(docs/design/sweeps.md#sweeps, #requeue).

Each view fetches through a selector (another Project's Sweep is a 404),
calls at most one service and renders. Who may create, and why not, comes
from ``mado.policy``.
"""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods

from mado import policy
from mado.errors import ValidationFailed
from runs import selectors as run_selectors
from runs.views import page
from sweeps import charts, selectors, services
from sweeps.forms import SweepCreateForm


@page
@require_GET
def sweep_list(request, slug):
    """The Sweeps of a Project with their method, metric and trial counts, and the "New sweep" button."""
    project = run_selectors.project_get_for_user(user=request.user, slug=slug)
    context = {
        "project": project,
        "sweeps": selectors.sweep_list(user=request.user, project=project),
        "create_refusal": policy.why_not(request.user, project, policy.MEMBER),
    }
    return render(request, "sweeps/sweep_list.html", context)


@page
@require_http_methods(["GET", "POST"])
def sweep_create(request, slug):
    """GET: the form with an example configuration; POST: ``services.sweep_create`` → the Sweep page.

    A configuration error is shown on the form, naming the field of the configuration.
    """
    project = run_selectors.project_get_for_user(user=request.user, slug=slug)
    refusal = policy.why_not(request.user, project, policy.MEMBER)
    if request.method == "POST" and refusal:
        raise PermissionDenied(refusal)
    form = SweepCreateForm(request.POST if request.method == "POST" else None)
    status = 400 if form.is_bound else 200
    if form.is_bound and form.is_valid():
        try:
            sweep = services.sweep_create(actor=request.user, project=project, config=form.cleaned_data["config"])
        except ValidationFailed as exc:
            form.add_error("config", f"{exc.field}: {exc.detail}" if exc.field else exc.detail)
        else:
            messages.success(
                request, _("Sweep %(id)s was created: start agents with “mado agent %(id)s”.") % {"id": sweep.pk}
            )
            return redirect("runs:sweep-detail", pk=sweep.pk)
    context = {"project": project, "form": form, "refusal": refusal}
    return render(request, "sweeps/sweep_create.html", context, status=status)


@page
@require_GET
def sweep_detail(request, pk):
    """A Sweep: its configuration, trials table (parameters, metric, state, requeue count, Run, earlier attempts),
    best trial and one uPlot scatter plot of the metric against each searched parameter."""
    sweep = selectors.sweep_get_for_user(user=request.user, sweep_id=pk)
    trials = selectors.sweep_trials(sweep=sweep)
    best = selectors.sweep_best_trial(sweep=sweep, trials=trials)
    scatters = charts.sweep_scatters(sweep=sweep, trials=trials, best=best)
    context = {
        "sweep": sweep,
        "project": sweep.project,
        "rows": [(trial, [trial.parameters.get(name) for name in sorted(sweep.parameters)]) for trial in trials],
        "best": best,
        "counts": selectors.trial_counts_of(sweep),
        "parameter_names": sorted(sweep.parameters),
        "scatters": scatters,
        "scatter_data": charts.scatter_data(sweep=sweep, scatters=scatters),
        "retryable": sorted(services.RETRYABLE),
    }
    return render(request, "sweeps/sweep_detail.html", context)
