"""Pages of Jobs: launch, the Jobs list, a Job, abort, resume from latest, resume from a checkpoint, continue
from a checkpoint (docs/design/resume.md#continue), the log tail.

docs/design/resume.md; docs/design/worker.md#subprocess. Each view fetches through a selector
(another Project's object is a 404), calls at most one service and renders
or redirects. Who may do what, and why not, comes from ``mado.policy``; the
services check again under row locks, so a page that went stale meanwhile
gets a form error or a message, never a 500. The list, a Job's status and
the logs refresh through htmx partials while a Job is not final.
"""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from checkpoints.models import CheckpointState
from checkpoints.selectors import checkpoint_get_for_user
from jobs import selectors, services
from jobs.forms import CheckpointContinueForm, CheckpointResumeForm, JobLaunchForm
from mado import policy
from mado.errors import Conflict, ValidationFailed
from parity import selectors as parity_selectors
from runs import selectors as run_selectors
from runs.forms import add_service_error
from runs.views import page, run_page_context

JOBS_PER_PAGE = 25
SERVICE_FORM_ERRORS = (ValidationFailed, Conflict)


def _refusal_message(error):
    """A service refusal for a message or a form: an active resume of the Run links to its Job."""
    job_id = error.extra.get("job_id")
    if not job_id:
        return error.detail
    return format_html(
        '{} <a href="{}">{}</a>',
        _("A resume of this run is already queued or running:"),
        reverse("jobs:job-detail", args=[job_id]),
        _("Job %(id)s") % {"id": job_id},
    )


def _back(request, job):
    """Where a button's POST returns: its ``next`` (same site only), else the Job page."""
    target = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return redirect(target)
    return redirect("jobs:job-detail", pk=job.pk)


def _job_actions(user, job, active_resumes: dict[int, int]) -> dict:
    """The Job's buttons or, in their place, the policy's sentence (docs/design/resume.md#who-may-resume): resume from
    latest, abort.

    ``active_resume_id``: the resume of this Job's Run already queued or running, if any.
    """
    return {
        "job": job,
        "resume_refusal": selectors.resume_refusal(user=user, run=job.run),
        "manage_refusal": policy.why_cannot_manage_job(user, job.run),
        "active_resume_id": active_resumes.get(job.run_id),
    }


def _jobs_context(request, project) -> dict:
    page_obj = Paginator(selectors.job_list(user=request.user, project=project), JOBS_PER_PAGE).get_page(
        request.GET.get("page")
    )
    active = selectors.active_resume_job_ids(run_ids=[job.run_id for job in page_obj])
    declared = parity_selectors.declared_verdicts_by_run(runs=[job.run for job in page_obj])
    return {
        "project": project,
        "page_obj": page_obj,
        "rows": [{**_job_actions(request.user, job, active), "declared": declared.get(job.run_id)} for job in page_obj],
        "live": any(not job.is_final for job in page_obj),
        "launch_refusal": policy.why_not(request.user, project, policy.MEMBER),
    }


@page
@require_GET
def project_jobs(request, slug):
    """The Jobs list of a Project (docs/design/resume.md#from-a-checkpoint, #latest-checkpoint): status, kind badge,
    queue, creator, attempt, duration, buttons."""
    project = run_selectors.project_get_for_user(user=request.user, slug=slug)
    return render(request, "jobs/job_list.html", _jobs_context(request, project))


@page
@require_GET
def project_jobs_table(request, slug):
    """The Jobs table partial that the list polls (htmx) while any Job on the page is not final."""
    project = run_selectors.project_get_for_user(user=request.user, slug=slug)
    return render(request, "jobs/_job_table.html", _jobs_context(request, project))


@page
@require_http_methods(["GET", "POST"])
def job_launch(request, slug):
    """GET: the Launch Job form, or why the user cannot launch; POST: ``services.job_launch`` → the Job page."""
    project = run_selectors.project_get_for_user(user=request.user, slug=slug)
    form = JobLaunchForm(request.POST if request.method == "POST" else None, project=project)
    status = 400 if form.is_bound else 200
    if form.is_bound and form.is_valid():
        try:
            job = services.job_launch(actor=request.user, **form.service_arguments())
        except SERVICE_FORM_ERRORS as exc:
            add_service_error(form, exc)
            status = exc.status
        else:
            messages.success(request, _("Job %(id)s was queued on %(queue)s.") % {"id": job.pk, "queue": job.queue})
            return redirect("jobs:job-detail", pk=job.pk)
    context = {"project": project, "form": form, "refusal": policy.why_not(request.user, project, policy.MEMBER)}
    return render(request, "jobs/job_launch.html", context, status=status)


def _job_page_context(request, job) -> dict:
    chunks, hidden = selectors.run_log_tail_last(run=job.run)
    active = selectors.active_resume_job_ids(run_ids=[job.run_id])
    return {**_job_actions(request.user, job, active), "run": job.run, "chunks": chunks, "hidden_chunks": hidden}


@page
@require_GET
def job_detail(request, pk):
    """A Job: status, kind, queue, attempt, exit code, error, worker, times, lineage, log tail, buttons
    (docs/design/worker.md#refusal, #subprocess)."""
    job = selectors.job_get_for_user(user=request.user, job_id=pk)
    return render(request, "jobs/job_detail.html", _job_page_context(request, job))


@page
@require_GET
def job_live(request, pk):
    """The Job page's live part (status, error, buttons, log tail), polled while the Job is not final."""
    job = selectors.job_get_for_user(user=request.user, job_id=pk)
    return render(request, "jobs/_job_live.html", _job_page_context(request, job))


@page
@require_POST
def job_abort(request, pk):
    """``services.job_abort``: creator or Project admin (else 403); a Job that already ended → a message."""
    job = selectors.job_get_for_user(user=request.user, job_id=pk)
    try:
        job = services.job_abort(actor=request.user, job=job)
    except Conflict as exc:
        messages.error(request, exc.detail)
    else:
        if job.is_final:
            messages.success(request, _("Job %(id)s was aborted.") % {"id": job.pk})
        else:
            messages.success(request, _("Abort of Job %(id)s requested: the worker stops the code.") % {"id": job.pk})
    return _back(request, job)


@page
@require_http_methods(["GET", "POST"])
def job_resume_latest(request, pk):
    """ "Resume from latest checkpoint" (docs/design/resume.md#latest-checkpoint). GET (the button): the confirmation
    page of the Run's latest complete checkpoint, where the Code version and queue are chosen; POST:
    ``services.job_resume_from_latest`` → the new Job's page."""
    job = selectors.job_get_for_user(user=request.user, job_id=pk)
    if request.method == "GET":
        latest = selectors.latest_resume_checkpoint(run=job.run)
        if latest is None:
            messages.error(request, _("This run has no complete checkpoint to resume from."))
            return _back(request, job)
        return redirect("jobs:checkpoint-resume", pk=latest.pk)
    try:
        new = services.job_resume_from_latest(actor=request.user, job=job)
    except SERVICE_FORM_ERRORS as exc:
        messages.error(request, _refusal_message(exc))
        return _back(request, job)
    step = new.run.source_checkpoint.step
    messages.success(
        request, _("Job %(id)s resumes the run from the checkpoint at step %(step)s.") % {"id": new.pk, "step": step}
    )
    return redirect("jobs:job-detail", pk=new.pk)


@page
@require_http_methods(["GET", "POST"])
def checkpoint_resume(request, pk):
    """GET: the confirmation "Training will resume as a new Run from the checkpoint at step N."
    (docs/design/resume.md#from-a-checkpoint) with the Code version and queue, or the reason the user cannot; POST:
    ``services.run_resume_from_checkpoint``.

    A second POST while the first resume is active is refused by the service
    (one active resume per Run): the page says so and links the Job.
    """
    checkpoint = checkpoint_get_for_user(user=request.user, checkpoint_id=pk)
    source_job = selectors.job_for_run(run=checkpoint.run)
    form = CheckpointResumeForm(
        request.POST if request.method == "POST" else None, source_job=source_job, checkpoint=checkpoint
    )
    status = 400 if form.is_bound else 200
    if form.is_bound and form.is_valid():
        try:
            job = services.run_resume_from_checkpoint(
                actor=request.user, checkpoint=checkpoint, **form.service_arguments()
            )
        except SERVICE_FORM_ERRORS as exc:
            form.add_error(exc.field if exc.field in form.fields else None, _refusal_message(exc))
            status = exc.status
        else:
            messages.success(
                request,
                _("Job %(id)s resumes the run from the checkpoint at step %(step)s.")
                % {"id": job.pk, "step": checkpoint.step},
            )
            return redirect("jobs:job-detail", pk=job.pk)
    refusal = selectors.resume_refusal(user=request.user, run=checkpoint.run, need_checkpoint=False)
    if not refusal and checkpoint.state != CheckpointState.COMPLETE:
        refusal = _("This checkpoint is not complete: it cannot be used to resume.")
    context = {
        "checkpoint": checkpoint,
        "run": checkpoint.run,
        "source_job": source_job,
        "form": form,
        "refusal": refusal,
    }
    return render(request, "jobs/checkpoint_resume.html", context, status=status)


@page
@require_http_methods(["GET", "POST"])
def checkpoint_continue(request, pk):
    """ "Continue training from these weights" (docs/design/resume.md#continue): GET the form (data mix preselected with
    the composition at the checkpoint's step); POST shows the confirmation of what will run; POST with ``confirm``
    launches ``services.run_continue_from_checkpoint`` → the new Job's page. A refusal by the service is a form
    error."""
    checkpoint = checkpoint_get_for_user(user=request.user, checkpoint_id=pk)
    source_run = checkpoint.run
    if request.method == "POST" and not policy.can_write_runs(request.user, source_run.project):
        raise PermissionDenied(policy.why_not(request.user, source_run.project, policy.MEMBER))
    source_job = selectors.job_for_run(run=source_run)
    form = CheckpointContinueForm(
        request.POST if request.method == "POST" else None,
        source_run=source_run,
        source_job=source_job,
        composition=run_selectors.data_composition_at(run=source_run, step=checkpoint.step),
        checkpoint=checkpoint,
    )
    confirming, status = False, 400 if form.is_bound else 200
    if form.is_bound and form.is_valid():
        confirming, status = not request.POST.get("edit"), 200
        if confirming and request.POST.get("confirm"):
            try:
                job = services.run_continue_from_checkpoint(
                    actor=request.user, checkpoint=checkpoint, **form.service_arguments()
                )
            except SERVICE_FORM_ERRORS as exc:
                add_service_error(form, exc)
                confirming, status = False, exc.status
            else:
                messages.success(
                    request,
                    _("Job %(id)s continues training from the checkpoint at step %(step)s.")
                    % {"id": job.pk, "step": checkpoint.step},
                )
                return redirect("jobs:job-detail", pk=job.pk)
    context = {
        "checkpoint": checkpoint,
        "run": source_run,
        "source_job": source_job,
        "form": form,
        "confirming": confirming,
        "refusal": policy.why_cannot_continue(request.user, checkpoint),
    }
    return render(request, "jobs/checkpoint_continue.html", context, status=status)


@page
@require_GET
def run_log(request, pk):
    """The Run's log tail partial (Logs tab), polled while its Job is queued or running
    (docs/design/worker.md#subprocess)."""
    run = run_selectors.run_get_for_user(user=request.user, run_id=pk)
    chunks, hidden = selectors.run_log_tail_last(run=run)
    context = {"run": run, "job": selectors.job_for_run(run=run), "chunks": chunks, "hidden_chunks": hidden}
    return render(request, "jobs/_log.html", context)


@page
@require_GET
def run_logs(request, pk):
    """The Run page's Logs tab: the tail of what its Job's code printed (docs/design/worker.md#subprocess)."""
    run, context = run_page_context(request, pk, "logs")
    chunks, hidden = selectors.run_log_tail_last(run=run)
    context.update(chunks=chunks, hidden_chunks=hidden)
    return render(request, "runs/run_detail.html", context)
