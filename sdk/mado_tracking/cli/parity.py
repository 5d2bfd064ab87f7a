"""What ``mado job show`` prints about a resumed Run: what it did not restore from its checkpoint, whether it seems
to have ignored it, and its parity verdict with its parent (docs/design/resume.md#restore-report, #parity; docs/api.md
"Resume parity"). Reads the Job resource's ``restore_report``, ``resume_ignored_at_step`` and ``parity`` (with its
``declared`` changes, docs/design/resume.md#declared-changes)."""

import json

import click

STATUS_WORDS = {
    "not_restored": "not restored",
    "not_declared": "not declared in the checkpoint",
    "unknown": "not checked",
}


def parts_with(report: dict, status: str) -> list[str]:
    """The parts of a ``restore_report`` resource with ``status`` (``not_restored``, ``not_declared``, ``unknown``),
    sorted: its list of that name and its ``parts`` (a server that lists no ``not_declared`` still gives them)."""
    listed = report.get(status) if isinstance(report.get(status), list) else []
    return sorted({*listed, *(part for part, state in (report.get("parts") or {}).items() if state == status)})


def describe_parity(parity: dict) -> str:
    """One line of a Run resource's ``parity`` (docs/api.md "Resume parity"): the verdict and where it comes from."""
    verdict = parity.get("verdict")
    span = f"steps {parity.get('first_step')}-{parity.get('last_step')}"
    if verdict == "identical":
        return f"identical over {span} on {', '.join(parity.get('compared_keys') or [])}"
    if verdict == "within_tolerance":
        return (
            f"within tolerance {parity.get('tolerance')} over {span} (largest relative difference "
            f"{parity.get('max_difference')})"
        )
    if verdict == "diverged":
        declared = (parity.get("declared") or {}).get("divergence_declared")
        where = "changed on purpose from" if declared else "diverged at"
        return (
            f"{where} step {parity.get('step')}: {parity.get('key')} {parity.get('parent_value')} in the parent "
            f"run, {parity.get('child_value')} here"
        )
    return f"unknown (no step logged by both runs from the checkpoint's step {parity.get('checkpoint_step')} on)"


def _shown(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def describe_declared_change(change: dict) -> str:
    """One line of a ``parity.declared.changes`` item (docs/api.md "Resume parity"): the change made on purpose and
    whether it took effect, as the Run page says it."""
    old = _shown(change.get("old_value"))
    line = f"changed on purpose: {change.get('key')} {old} → {_shown(change.get('new_value'))}"
    if change.get("took_effect_at_step") is not None:
        return f"{line} (took effect at step {change['took_effect_at_step']})"
    if not change.get("overridden"):
        return f"{line} (not seen in the logged metrics or the restore report: whether it took effect is not known)"
    by = {"scheduler": "the restored scheduler", "optimizer": "the restored optimizer state"}.get(
        change.get("overridden_by") or ""
    )
    if by:
        return f"{line} — but the optimizer still ran at {old} ({by} overrode it)"
    return f"{line} — but the run still logged {old}, as the parent run did"


def print_resume_facts(found: dict) -> None:
    """``mado job show``'s lines about a resumed Run: not restored, not declared, resume ignored, parity."""
    report = found.get("restore_report")
    if report and report.get("not_restored"):
        click.echo(f"  not restored from the checkpoint: {', '.join(report['not_restored'])}")
        for part in report["not_restored"]:
            if (report.get("details") or {}).get(part):
                click.echo(f"    {part}: {report['details'][part]}")
    elif report:
        click.echo("  restored from the checkpoint: everything checked")
    undeclared = parts_with(report, "not_declared") if report else []
    if undeclared:
        click.echo(f"  not declared in the checkpoint, so not checked: {', '.join(undeclared)}")
        for part in undeclared:
            if (report.get("details") or {}).get(part):
                click.echo(f"    {part}: {report['details'][part]}")
    ignored, checkpoint_step = found.get("resume_ignored_at_step"), found.get("source_checkpoint_step")
    if ignored is not None and checkpoint_step is not None and ignored >= checkpoint_step:
        click.echo(
            f"  resume ignored?: checkpoint {found.get('source_checkpoint_id')} (step {checkpoint_step}) holds a "
            f"training state but the run sent no restore report before its first metrics (step {ignored}): it did "
            "not load the checkpoint through mado_tracking"
        )
    elif ignored is not None:
        click.echo(
            f"  resume ignored?: the first logged step {ignored} lies below the checkpoint's step {checkpoint_step}"
        )
    if found.get("parity"):
        click.echo(f"  parity: {describe_parity(found['parity'])}")
        for change in (found["parity"].get("declared") or {}).get("changes") or []:
            click.echo(f"    {describe_declared_change(change)}")
