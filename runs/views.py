"""Pages of Projects, Runs and members (docs/design/interfaces.md#surfaces) and the Run's "Training data history" tab
with "Record data change" (docs/design/runs.md#data-stages).

Each view authenticates, parses input with a form, fetches through a
selector (another Project's object is a 404), calls at most one service and
renders. Permissions come from ``mado.policy`` only.
"""

import functools

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpResponseBadRequest, QueryDict, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy as _lazy
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from mado import policy
from mado.errors import Conflict, Forbidden, NotFound, ValidationFailed
from runs import charts, compare, selectors, services, table
from runs.forms import DataStageRecordForm, MemberAddForm, MemberRoleForm, RunFilterForm, add_service_error
from runs.service_accounts import service_account_list

RUNS_PER_PAGE = 25
# (tab, URL name, template); "data-history" is docs/design/runs.md#data-stages, "logs" docs/design/worker.md#subprocess.
# The Checkpoint and Artifacts tabs are the checkpoints app's pages (checkpoints/views.py), the Logs tab the jobs app's;
# config/urls.py puts them in "runs:".
RUN_TABS = [
    ("overview", "runs:run-detail", "runs/_tab_overview.html"),
    ("checkpoints", "runs:run-checkpoints", "checkpoints/_tab_checkpoints.html"),
    ("artifacts", "runs:run-artifacts", "checkpoints/_tab_artifacts.html"),
    ("data-history", "runs:run-data-history", "runs/_tab_data_history.html"),
    ("logs", "runs:run-logs", "runs/_tab_logs.html"),
    ("system", "runs:run-system", "runs/_tab_system.html"),
]
SERVICE_FORM_ERRORS = (ValidationFailed, Conflict)
# The runs table's fixed columns: (sort name, header).
FIXED_COLUMNS = [
    ("name", _lazy("Name")),
    ("status", _lazy("Status")),
    ("kind", _lazy("Kind")),
    ("creator", _lazy("Created by")),
    ("started", _lazy("Started")),
]


def page(view):
    """Log-in required; a selector's ``NotFound`` answers 404 and a service's ``Forbidden`` 403."""

    @functools.wraps(view)
    def wrapped(request, *args, **kwargs):
        try:
            return view(request, *args, **kwargs)
        except NotFound as exc:
            raise Http404(exc.detail) from exc
        except Forbidden as exc:
            raise PermissionDenied(exc.detail) from exc

    return login_required(wrapped)


@page
@require_GET
def project_list(request):
    projects = selectors.project_list_with_roles(user=request.user)
    return render(request, "runs/project_list.html", {"projects": projects})


def _run_table(request, project):
    """``(form, rows, columns, choices, error)`` of the runs table for the GET parameters (error: a
    ``ValidationFailed`` shown on the form, rows then empty)."""
    form = RunFilterForm(request.GET)
    if not form.is_valid():
        return form, [], [], None, True
    try:
        rows, columns, choices = table.run_table_for_user(
            user=request.user, project=project, filters=form.cleaned_data, column_ids=request.GET.getlist("col")
        )
    except ValidationFailed as exc:
        add_service_error(form, exc)
        return form, [], [], None, True
    return form, rows, columns, choices, False


@page
@require_GET
def project_detail(request, slug):
    """The runs table (docs/design/interfaces.md#workspace): chosen parameter and metric columns, sort, filters, search,
    pagination, selection."""
    project = selectors.project_get_for_user(user=request.user, slug=slug)
    form, rows, columns, choices, invalid = _run_table(request, project)
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "project": project,
        "form": form,
        "columns": columns,
        "choices": choices,
        "query": query.urlencode(),
        "page_obj": Paginator(table.PageByIds(rows) if not invalid else [], RUNS_PER_PAGE).get_page(
            request.GET.get("page")
        ),
        "sort": form.cleaned_data.get("sort", "") if not invalid else "",
        "fixed_columns": FIXED_COLUMNS,
        "metric_stats": table.METRIC_STATS,
        "column_ids": {column.id for column in columns},
        "kept_filters": [(k, v) for k, v in request.GET.items() if k in RunFilterForm.base_fields and v],
        "role": policy.role_in(request.user, project),
        "can_manage_members": policy.can_manage_members(request.user, project),
    }
    return render(request, "runs/project_detail.html", context, status=400 if invalid else 200)


@page
@require_POST
def project_columns(request, slug):
    """Remember the runs-table columns chosen in the picker for this user (``run_table_columns_save``; "reset":
    back to the defaults), then show the table with the filters it had."""
    project = selectors.project_get_for_user(user=request.user, slug=slug)
    columns = [] if request.POST.get("action") == "reset" else request.POST.getlist("col")
    try:
        services.run_table_columns_save(user=request.user, project=project, column_ids=columns)
    except ValidationFailed as exc:
        messages.error(request, f"{exc.field}: {exc.detail}")
    kept = QueryDict(mutable=True)
    for name in RunFilterForm.base_fields:
        if request.POST.get(name):
            kept[name] = request.POST[name]
    return redirect(f"{reverse('runs:project-detail', args=[project.slug])}?{kept.urlencode()}".rstrip("?"))


@page
@require_GET
def project_runs_csv(request, slug):
    """Every run of the table (same filters, search, sort and columns) as CSV, streamed
    (docs/design/interfaces.md#workspace)."""
    project = selectors.project_get_for_user(user=request.user, slug=slug)
    form, rows, columns, _choices, invalid = _run_table(request, project)
    if invalid:
        return HttpResponseBadRequest("; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
    response = StreamingHttpResponse(table.csv_lines(rows, columns), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{project.slug}-runs.csv"'
    return response


@page
@require_GET
def project_compare(request, slug):
    """Selected runs side by side (docs/design/interfaces.md#workspace): overlaid charts, the parameter diff,
    checkpoints and data stages."""
    project = selectors.project_get_for_user(user=request.user, slug=slug)
    try:
        comparison = compare.run_comparison(
            user=request.user,
            project=project,
            run_ids=request.GET.getlist("run"),
            all_parameters=request.GET.get("all") == "1",
        )
    except ValidationFailed as exc:
        return render(request, "runs/project_compare.html", {"project": project, "error": exc.detail}, status=400)
    context = {"project": project, "c": comparison, "charts": comparison.charts, "chart_data": comparison.chart_data}
    return render(request, "runs/project_compare.html", context)


def run_page_context(request, pk, tab: str, **context):
    """``(run, context)`` for one tab of the Run page (``runs/run_detail.html``); another Project's Run: ``NotFound``.

    What the page shows of the Run's Job the templates read through the jobs app's tags (``jobs_ui``).
    """
    run = selectors.run_get_for_user(user=request.user, run_id=pk)
    template = next(t for name, _url, t in RUN_TABS if name == tab)
    context.update(run=run, tab=tab, tabs=RUN_TABS, tab_template=template)
    return run, context


def _charts_context(request, run) -> dict:
    """The charts of the Run alone, or with ``?ancestors=1`` joined with its parent chain's curves
    (docs/design/resume.md#steps-continue)."""
    if request.GET.get("ancestors") == "1" and run.parent_id:
        chart_list, lineage = charts.run_charts_with_ancestors(user=request.user, run=run)
        return {
            "charts": chart_list,
            "chart_data": charts.chart_data(chart_list),
            "lineage": lineage,
            "with_ancestors": True,
        }
    system = request.GET.get("system") == "1"
    chart_list = charts.run_charts(run=run, system=system)
    return {
        "charts": chart_list,
        "chart_data": charts.chart_data(chart_list),
        "with_ancestors": False,
        "system_tab": system,
    }


def _ignored_checkpoint_step(run) -> int | None:
    """The first logged step of a Run started from a checkpoint when it lies below the checkpoint's step."""
    if not run.source_checkpoint_id:
        return None
    first = selectors.run_first_metric_step(run=run)
    return first if first is not None and first < run.source_checkpoint.step else None


@page
@require_GET
def run_detail(request, pk):
    run, context = run_page_context(request, pk, "overview")
    context.update(
        children=selectors.run_children(user=request.user, run=run),
        dataset_versions=selectors.run_input_dataset_versions(run=run),
        ignored_checkpoint_step=_ignored_checkpoint_step(run),
        parameter_changes=selectors.run_parameter_changes(run=run),
        sweep_trial=selectors.run_sweep_trial(run=run),
        **_charts_context(request, run),
    )
    return render(request, "runs/run_detail.html", context)


@page
@require_GET
def run_system(request, pk):
    """The System tab (docs/design/interfaces.md#system-metrics): charts of the ``system/…`` metrics the SDK sampled
    (CPU, memory, disk, network, GPUs), refreshed like the Overview's while the Run is live."""
    run, context = run_page_context(request, pk, "system")
    chart_list = charts.run_charts(run=run, system=True)
    context.update(charts=chart_list, chart_data=charts.chart_data(chart_list), system_tab=True)
    return render(request, "runs/run_detail.html", context)


@page
@require_GET
def run_charts(request, pk):
    """The charts partial that the Run page polls (htmx) while the Run is not final."""
    run = selectors.run_get_for_user(user=request.user, run_id=pk)
    return render(request, "runs/_charts.html", {"run": run, **_charts_context(request, run)})


# "The latest step" of a running Run: the composition in force from its last stage on.
LATEST_STEP = 2**62


def _data_stage_form(request, run):
    """The "Record data change" form, bound on POST, preloaded with the composition in force now
    (docs/design/runs.md#data-stages)."""
    return DataStageRecordForm(
        request.POST if request.method == "POST" else None,
        versions=selectors.dataset_version_choices(project=run.project),
        composition=selectors.data_composition_at(run=run, step=LATEST_STEP),
        checkpoints=run.checkpoints.usable().order_by("-step"),
    )


@page
@require_http_methods(["GET", "POST"])
def run_data_history(request, pk):
    """The "Training data history" tab (docs/design/runs.md#data-stages): the starting composition, one row per stage
    with what it added and removed, and on a running Run the "Record data change" form (POST:
    ``services.data_stage_record``)."""
    run, context = run_page_context(request, pk, "data-history")
    refusal = policy.why_cannot_write_run(request.user, run)
    if request.method == "POST" and refusal:
        raise PermissionDenied(refusal)
    form = _data_stage_form(request, run)
    status = 400 if form.is_bound else 200
    if form.is_bound and form.is_valid():
        try:
            stage, created = services.data_stage_record(actor=request.user, run=run, **form.service_arguments())
        except SERVICE_FORM_ERRORS as exc:
            add_service_error(form, exc)
            status = exc.status
        else:
            note = (
                _("The data change at step %(step)s was recorded.")
                if created
                else _("This data change at step %(step)s was already recorded.")
            )
            messages.success(request, note % {"step": stage.start_step})
            return redirect("runs:run-data-history", pk=run.pk)
    context.update(
        initial_versions=selectors.run_input_dataset_versions(run=run),
        stages=selectors.data_stage_history(run=run),
        record_refusal=selectors.why_cannot_record_stage(user=request.user, run=run),
        form=form,
    )
    return render(request, "runs/run_detail.html", context, status=status)


def _administered_project(request, slug):
    """The Project if the user administers it: outsider → 404, other members → 403 (with the reason)."""
    project = selectors.project_get_for_user(user=request.user, slug=slug)
    if not policy.can_manage_members(request.user, project):
        raise PermissionDenied(policy.why_not(request.user, project, policy.ADMIN))
    return project


def _members_page(request, project, *, add_form=None, errors=(), status=200, new_key=None):
    context = {
        "project": project,
        "members": selectors.membership_list(project=project),
        "add_form": add_form or MemberAddForm(),
        "role_choices": MemberRoleForm.base_fields["role"].choices,
        "errors": errors,
        "service_accounts": service_account_list(actor=request.user, project=project),
        "new_key": new_key,
    }
    return render(request, "runs/project_members.html", context, status=status)


def _after_member_change(request, project):
    """Back to the members page, or further out when the actor just gave up admin rights."""
    if policy.can_manage_members(request.user, project):
        return redirect("runs:project-members", slug=project.slug)
    if policy.role_in(request.user, project):
        return redirect("runs:project-detail", slug=project.slug)
    return redirect("runs:project-list")


@page
@require_http_methods(["GET", "POST"])
def project_members(request, slug):
    """List members; POST adds one (``membership_add``)."""
    project = _administered_project(request, slug)
    if request.method == "GET":
        return _members_page(request, project)
    form = MemberAddForm(request.POST)
    if form.is_valid():
        try:
            services.membership_add(actor=request.user, project=project, **form.cleaned_data)
        except SERVICE_FORM_ERRORS as exc:
            add_service_error(form, exc)
            return _members_page(request, project, add_form=form, status=exc.status)
        messages.success(request, _("%(username)s was added.") % form.cleaned_data)
        return redirect("runs:project-members", slug=project.slug)
    return _members_page(request, project, add_form=form, status=400)


@page
@require_POST
def member_role(request, slug, username):
    """Change a member's role (``membership_change_role``); the last admin stays admin."""
    project = _administered_project(request, slug)
    form = MemberRoleForm(request.POST)
    if form.is_valid():
        try:
            services.membership_change_role(actor=request.user, project=project, username=username, **form.cleaned_data)
        except SERVICE_FORM_ERRORS as exc:
            add_service_error(form, exc)
            return _members_page(request, project, errors=_flat(form, username), status=exc.status)
        messages.success(request, _("The role of %(username)s was changed.") % {"username": username})
        return _after_member_change(request, project)
    return _members_page(request, project, errors=_flat(form, username), status=400)


@page
@require_POST
def member_remove(request, slug, username):
    """Remove a member (``membership_remove``); the last admin cannot be removed."""
    project = _administered_project(request, slug)
    try:
        services.membership_remove(actor=request.user, project=project, username=username)
    except SERVICE_FORM_ERRORS as exc:
        return _members_page(request, project, errors=[f"{username}: {exc.detail}"], status=exc.status)
    messages.success(request, _("%(username)s was removed.") % {"username": username})
    return _after_member_change(request, project)


def _flat(form, username: str) -> list[str]:
    return [f"{username}: {message}" for errors in form.errors.values() for message in errors]
