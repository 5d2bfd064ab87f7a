"""What the Run page shows of the Run's Job, for the templates of the lower apps' tabs.

``{% load jobs_ui %}{% job_of_run run as job %}`` and
``{% resume_refusal_of run as resume_refusal %}``: a template of runs or
checkpoints names the jobs app here, so neither app imports it
(docs/design/house.md#arrows) and no question goes through a signal.
"""

from django import template

from jobs import selectors

register = template.Library()


@register.simple_tag
def job_of_run(run):
    """The Job that executes ``run`` (with its queue and Code), or None for a Run created by the SDK alone."""
    return selectors.job_for_run(run=run) if run.ran_as_job else None


@register.simple_tag(takes_context=True)
def resume_refusal_of(context, run) -> str | None:
    """Why the request's user cannot resume ``run`` from one of its checkpoints (the button's place), or None."""
    return selectors.resume_refusal(user=context["request"].user, run=run, need_checkpoint=False)
