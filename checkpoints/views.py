"""Pages of Checkpoints and Artifacts: the Run's Checkpoint and Artifacts tabs, a checkpoint's manifest, deletion.

docs/design/checkpoints.md#keep-count, #deletion; docs/design/interfaces.md#surfaces. Each view fetches through a
selector (another Project's object is a 404), calls at most one service and renders or redirects. Who may delete what,
and why not, comes from the selectors' blocker functions (``mado.policy`` underneath); the services check again under
row locks, so a page that went stale meanwhile gets a message, never a
500. Downloads are the API's streamed endpoints, which accept the session.
"""

from django.contrib import messages
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods

from checkpoints import selectors, services
from checkpoints.models import CheckpointState
from mado import policy
from mado.errors import Conflict
from runs.views import page, run_page_context

ARTIFACTS_PER_PAGE = 50
MANIFEST_PER_PAGE = 500


@page
@require_GET
def run_checkpoints(request, pk):
    """The Checkpoint tab (docs/design/checkpoints.md#keep-count): the newest K complete checkpoints and failed uploads
    (with their reason); ``?older=1`` lists every one, deleted too.

    Each complete checkpoint offers its tar, "Resume from here" (docs/design/resume.md#from-a-checkpoint), "Continue
    training" (docs/design/resume.md#continue) and Delete (docs/design/checkpoints.md#deletion); a refusal that holds
    for every row (the user's role) is said once above the table, a kept checkpoint says "kept" (the keep rule is said
    once in the tab's head)."""
    older = request.GET.get("older") == "1"
    run, context = run_page_context(request, pk, "checkpoints")
    checkpoints, hidden = selectors.checkpoint_list_for_run(
        run=run, include_older=older, include_unusable=older, include_failed=True
    )
    checkpoints = list(checkpoints)
    blockers = selectors.checkpoint_delete_blockers(user=request.user, run=run, checkpoints=checkpoints)
    # "Continue training from these weights" (docs/design/resume.md#continue) on each complete checkpoint, or the
    # sentence in its place.
    continue_refusals = {
        checkpoint.pk: policy.why_cannot_continue(request.user, checkpoint)
        for checkpoint in checkpoints
        if checkpoint.state == CheckpointState.COMPLETE
    }
    # A refusal every row would share (the user's role) is said once above the table, not on each row.
    context.update(
        rows=[(ckpt, blockers[ckpt.pk], continue_refusals.get(ckpt.pk)) for ckpt in checkpoints],
        continue_refusal=policy.why_not(request.user, run.project, policy.MEMBER),
        delete_refusal=None
        if policy.can_delete_artifacts(request.user, run.project)
        else policy.why_not(request.user, run.project, policy.ADMIN),
        older=older,
        hidden_older=hidden,
        keep_count=selectors.checkpoint_keep_count(),
    )
    return render(request, "runs/run_detail.html", context)


@page
@require_GET
def checkpoint_detail(request, pk):
    """One checkpoint: its facts, the tar's download link, "Continue training" (docs/design/resume.md#continue) or why
    not, its manifest (path, size, SHA-256), Delete or why not."""
    checkpoint = selectors.checkpoint_get_for_user(user=request.user, checkpoint_id=pk)
    manifest = Paginator(selectors.checkpoint_manifest(checkpoint=checkpoint), MANIFEST_PER_PAGE)
    context = {
        "checkpoint": checkpoint,
        "run": checkpoint.run,
        "manifest": manifest.get_page(request.GET.get("page")),
        "blocker": selectors.checkpoint_delete_blocker(user=request.user, checkpoint=checkpoint),
        "continue_refusal": policy.why_cannot_continue(request.user, checkpoint),
    }
    return render(request, "checkpoints/checkpoint_detail.html", context)


@page
@require_http_methods(["GET", "POST"])
def checkpoint_delete(request, pk):
    """GET: the confirmation, or the reason it cannot be deleted; POST: ``services.checkpoint_delete``
    (docs/design/checkpoints.md#deletion).

    Not an admin → 403 (the service's ``Forbidden``); a refusal by the rules
    (keep count, a Run's source, a concurrent change) → back to the tab with
    the reason as a message. The row stays, marked deleted.
    """
    checkpoint = selectors.checkpoint_get_for_user(user=request.user, checkpoint_id=pk)
    if request.method == "GET":
        blocker = selectors.checkpoint_delete_blocker(user=request.user, checkpoint=checkpoint)
        context = {"checkpoint": checkpoint, "run": checkpoint.run, "blocker": blocker}
        return render(request, "checkpoints/checkpoint_delete.html", context)
    try:
        services.checkpoint_delete(actor=request.user, checkpoint=checkpoint)
    except Conflict as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, _("The checkpoint at step %(step)s was deleted.") % {"step": checkpoint.step})
    return redirect(reverse("runs:run-checkpoints", args=[checkpoint.run_id]) + "?older=1")


@page
@require_GET
def run_artifacts(request, pk):
    """The Artifacts tab: the Run's stored files with size, SHA-256, download link and Delete button or why not."""
    run, context = run_page_context(request, pk, "artifacts")
    page_obj = Paginator(selectors.artifact_list(run=run), ARTIFACTS_PER_PAGE).get_page(request.GET.get("page"))
    blockers = selectors.artifact_delete_blockers(user=request.user, run=run, artifacts=page_obj)
    context.update(page_obj=page_obj, rows=[(artifact, blockers[artifact.pk]) for artifact in page_obj])
    return render(request, "runs/run_detail.html", context)


@page
@require_http_methods(["GET", "POST"])
def artifact_delete(request, pk):
    """GET ``?path=``: the confirmation or the reason; POST ``path``: ``services.artifact_delete``
    (docs/design/checkpoints.md#deletion).

    Not an admin → 403; a checkpoint's tar (the service's ``Conflict``) →
    back to the tab with the reason as a message.
    """
    path = (request.POST if request.method == "POST" else request.GET).get("path", "")
    artifact = selectors.artifact_get_for_user(user=request.user, run_id=pk, path=path)
    if request.method == "GET":
        blocker = selectors.artifact_delete_blockers(user=request.user, run=artifact.run, artifacts=[artifact])
        context = {"artifact": artifact, "run": artifact.run, "blocker": blocker[artifact.pk]}
        return render(request, "checkpoints/artifact_delete.html", context)
    try:
        services.artifact_delete(actor=request.user, artifact=artifact)
    except Conflict as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, _("%(path)s was deleted.") % {"path": artifact.path})
    return redirect("runs:run-artifacts", pk=artifact.run_id)
