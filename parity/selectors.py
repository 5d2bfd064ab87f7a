"""Reads of verdicts, restore reports and parity settings for pages and the API (docs/design/resume.md#parity,
#restore-report)."""

from collections import defaultdict

from django.db.models import Min

from parity.declared import DeclaredVerdict, declared_verdict
from parity.models import DEFAULT_TOLERANCE, Parity, ParityBlock, ParitySettings, ParityVerdict, RestoreReport
from runs.models import DataStage, ParameterChange, ResumeSegment, Run
from runs.stages import data_stage_history


def project_tolerance(*, project_id: int) -> float:
    """The relative tolerance of Project ``project_id`` (``ParitySettings``; default 1e-6)."""
    found = ParitySettings.objects.filter(project_id=project_id).values_list("tolerance", flat=True).first()
    return DEFAULT_TOLERANCE if found is None else found


def parity_of(run: Run) -> Parity | None:
    """``run``'s verdict row (loaded with ``select_related("parity")`` or read here), None when it has none: not
    started from a checkpoint, or nothing logged yet."""
    try:
        return run.parity
    except Parity.DoesNotExist:
        return None


def restore_report_of(run: Run) -> RestoreReport | None:
    """``run``'s restore report (``select_related("restore_report")`` or read here), or None."""
    try:
        return run.restore_report
    except RestoreReport.DoesNotExist:
        return None


def checkpoint_not_loaded(run: Run) -> bool:
    """True when ``run`` logged metrics from a checkpoint that holds a training state without a restore report: its
    code did not load the checkpoint through the SDK (docs/design/resume.md#checkpoint-not-loaded). A report that
    comes later makes it False."""
    parity = parity_of(run)
    return parity is not None and parity.checkpoint_not_loaded(reported=restore_report_of(run) is not None)


def resume_ignored_at_step(run: Run) -> int | None:
    """``run``'s first logged step (an int) when its code may have ignored its source checkpoint: the step lies
    below the checkpoint's, or the checkpoint was not loaded (``checkpoint_not_loaded``); else None
    (docs/design/resume.md#checkpoint-not-loaded)."""
    parity = parity_of(run)
    if parity is None:
        return None
    below = parity.first_step_below_checkpoint
    return parity.child_first_step if below is not None or checkpoint_not_loaded(run) else None


def declared_verdict_of(run: Run, parity: Parity | None) -> DeclaredVerdict | None:
    """The parameters ``run``'s resume or continue changed on purpose, each judged against its verdict ``parity`` and
    restore report (``parity.declared``; docs/design/resume.md#declared-changes); None without a change or a verdict.

    Reads ``run.parameter_changes`` and ``run.data_stages`` (prefetched by
    the lists: no query per Run without a change) and, for a Run with
    changes, each compared key's first diverged step (one aggregate over the
    verdict's blocks) and its data-stage history.
    """
    changes = [(change.key, change.old_value, change.new_value) for change in run.parameter_changes.all()]
    if parity is None:
        return None
    has_data = any(stage.start_step >= parity.checkpoint_step for stage in run.data_stages.all())
    data = _data_changes(run, parity.checkpoint_step) if has_data else []
    if not changes and not data:
        return None
    diverged_at = _diverged_at(ids=[parity.pk] if parity.pk is not None else []).get(parity.pk, {})
    return _judge(parity, changes=changes, data=data, diverged_at=diverged_at, report=restore_report_of(run))


def declared_verdicts_by_run(*, runs) -> dict[int, DeclaredVerdict]:
    """``{run id: DeclaredVerdict}`` of those of ``runs`` whose verdict is ``diverged`` and whose resume or continue
    changed something on purpose: what a list's badge needs to read "changed on purpose from step k" as the Run
    page's does (the Jobs list, Compare; docs/design/resume.md#declared-changes). Any other verdict's badge does not
    depend on declared changes, so those Runs are left out.

    The verdicts come from ``parity_of`` (``select_related("parity")`` saves
    a query per Run). For the whole list: no query without a diverged
    verdict, else one each for the parameter changes, the data stages, the
    restore reports and the blocks' first diverged steps; a Run with a data
    stage from its checkpoint's step on adds its data-stage history.
    """
    return _declared_verdicts([(run, parity_of(run)) for run in runs])


def _declared_verdicts(verdicts) -> dict[int, DeclaredVerdict]:
    """``declared_verdicts_by_run`` of ``(run, verdict or None)`` pairs."""
    diverged = {
        run.pk: (run, parity)
        for run, parity in verdicts
        if parity is not None and parity.verdict == ParityVerdict.DIVERGED
    }
    if not diverged:
        return {}
    changes = defaultdict(list)
    for run_id, key, old, new in (
        ParameterChange.objects.filter(run_id__in=diverged)
        .order_by("run_id", "changed_at", "id")
        .values_list("run_id", "key", "old_value", "new_value")
    ):
        changes[run_id].append((key, old, new))
    staged = {
        run_id
        for run_id, start_step in DataStage.objects.filter(run_id__in=diverged).values_list("run_id", "start_step")
        if start_step >= diverged[run_id][1].checkpoint_step
    }
    data = {run_id: _data_changes(diverged[run_id][0], diverged[run_id][1].checkpoint_step) for run_id in staged}
    judged = [run_id for run_id in diverged if changes[run_id] or data.get(run_id)]
    if not judged:
        return {}
    reports = {report.run_id: report for report in RestoreReport.objects.filter(run_id__in=judged)}
    diverged_at = _diverged_at(ids=[diverged[run_id][1].pk for run_id in judged])
    return {
        run_id: _judge(
            diverged[run_id][1],
            changes=changes[run_id],
            data=data.get(run_id, []),
            diverged_at=diverged_at.get(diverged[run_id][1].pk, {}),
            report=reports.get(run_id),
        )
        for run_id in judged
    }


def _diverged_at(*, ids: list[int], owner: str = "parity_id") -> dict[int, dict[str, int | None]]:
    """``{owner id: {compared key: first diverged step or None}}`` of the blocks whose ``owner`` (``parity_id`` or
    ``segment_id``) is among ``ids`` (one aggregate over their blocks)."""
    found = defaultdict(dict)
    if ids:
        blocks = ParityBlock.objects.filter(**{f"{owner}__in": ids}).values(owner, "key")
        for row in blocks.annotate(first=Min("diverged_step")).order_by():
            found[row[owner]][row["key"]] = row["first"]
    return found


def _judge(parity: Parity, *, changes, data, diverged_at, report: RestoreReport | None) -> DeclaredVerdict:
    return declared_verdict(
        changes=changes,
        data=data,
        diverged_at=diverged_at,
        parts=report.parts if report else {},
        details=report.details if report else {},
        first_step=parity.child_first_step,
        diverged_step=parity.step if parity.verdict == ParityVerdict.DIVERGED else None,
    )


def _data_changes(run: Run, checkpoint_step: int) -> list[tuple[int, list[str], list[str]]]:
    """``(start_step, datasets before, datasets after)`` of each data stage of ``run`` from ``checkpoint_step`` on
    that changed its data (``runs.stages.data_stage_history``); datasets as ``name:version``, sorted."""
    found = []
    for entry in data_stage_history(run=run):
        if entry["stage"].start_step < checkpoint_step or not (entry["added"] or entry["removed"]):
            continue
        after = [str(version) for version in entry["versions"]]
        before = sorted({*after, *map(str, entry["removed"])} - set(map(str, entry["added"])))
        found.append((entry["stage"].start_step, before, sorted(after)))
    return found


def parities_by_run(*, run_ids) -> dict[int, Parity]:
    """``{run id: Parity}`` of those of ``run_ids`` that have a verdict row (one query)."""
    return {parity.run_id: parity for parity in Parity.objects.filter(run_id__in=list(run_ids))}


def parity_pairs(*, runs) -> list[tuple[Run, Run, Parity, DeclaredVerdict | None]]:
    """``(parent, child, verdict, declared)`` for each Run of ``runs`` whose parent is among them too and that has a
    verdict, in the order of ``runs`` (the Compare page); ``declared`` as ``declared_verdicts_by_run`` gives it (None:
    not diverged, or nothing changed on purpose). A few queries, whatever the number of Runs."""
    by_id = {run.pk: run for run in runs}
    found = parities_by_run(run_ids=by_id)
    children = [run for run in runs if run.pk in found and run.parent_id in by_id]
    declared = _declared_verdicts([(run, found[run.pk]) for run in children])
    return [(by_id[run.parent_id], run, found[run.pk], declared.get(run.pk)) for run in children]


def segments_declared(*, run: Run) -> list[tuple[ResumeSegment, DeclaredVerdict | None]]:
    """Each resume segment of ``run`` in order with the parameters its resume changed on purpose
    (``allow_param_change``, recorded with the resuming writer's token), judged as a continue's are against what the
    segment logged again and the restore report it sent (docs/design/resume.md#declared-changes); None for a segment
    whose resume changed nothing. Two queries, a third when a resume changed something, whatever the number of
    segments."""
    segments = list(run.resume_segments.all())
    if not segments:
        return []
    changes = defaultdict(list)
    for token, key, old, new in (
        ParameterChange.objects.filter(run_id=run.pk, lease_token__in=[segment.lease_token for segment in segments])
        .order_by("changed_at", "id")
        .values_list("lease_token", "key", "old_value", "new_value")
    ):
        changes[token].append((key, old, new))
    changed = [segment for segment in segments if changes[segment.lease_token]]
    diverged_at = _diverged_at(ids=[segment.pk for segment in changed], owner="segment_id")
    return [
        (
            segment,
            declared_verdict(
                changes=changes[segment.lease_token],
                diverged_at=diverged_at[segment.pk],
                parts=segment.restore_parts or {},
                details=segment.restore_details or {},
                first_step=segment.first_step,
                diverged_step=segment.step if segment.verdict == ParityVerdict.DIVERGED else None,
            )
            if changes[segment.lease_token]
            else None,
        )
        for segment in segments
    ]
