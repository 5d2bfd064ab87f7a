"""What the Run page, the Job page, the Jobs list and Compare show of a resumed Run's restore report and parity
verdict (docs/design/resume.md#restore-report, #parity).

``{% load parity_ui %}{% parity_of_run run as parity %}``, ``{% restore_report_of run as report %}``,
``{% checkpoint_not_loaded run as not_loaded %}``, ``{% declared_verdict_of run parity as declared %}`` and
``{% parity_pairs runs as pairs %}``: the templates of runs and jobs name the parity app
here, so runs never imports it (docs/design/house.md#arrows).
``|parity_value`` shows a compared value as the API does.
"""

import math

from django import template

from parity import selectors
from parity.serializers import parity_of_run

register = template.Library()


@register.simple_tag(name="parity_of_run")
def parity_of_run_tag(run):
    """``run``'s verdict (an unsaved ``unknown`` one while a Run started from a checkpoint logged nothing), or
    None for a Run not started from a checkpoint."""
    return parity_of_run(run)


@register.simple_tag
def restore_report_of(run):
    """``run``'s restore report, or None."""
    return selectors.restore_report_of(run)


@register.simple_tag
def checkpoint_not_loaded(run):
    """True when ``run`` logged metrics without loading its checkpoint's training state (no restore report)."""
    return selectors.checkpoint_not_loaded(run)


@register.simple_tag(name="declared_verdict_of")
def declared_verdict_of_tag(run, parity):
    """The parameters ``run``'s resume or continue changed on purpose, judged against ``parity`` (a
    ``DeclaredVerdict``), or None without a change or a verdict."""
    return selectors.declared_verdict_of(run, parity)


@register.simple_tag
def segments_declared(run):
    """``(segment, declared)`` for each resume of ``run`` under its id (``declared``: a ``DeclaredVerdict`` of the
    parameters that resume changed, or None)."""
    return selectors.segments_declared(run=run)


@register.simple_tag
def parity_pairs(runs):
    """``(parent, child, verdict, declared)`` for each compared Run whose parent is compared too (the Compare page);
    ``declared`` (a ``DeclaredVerdict`` or None) makes a declared change's divergence read "changed on purpose"."""
    return selectors.parity_pairs(runs=list(runs))


@register.filter
def parity_value(value):
    """A compared value: ``repr`` (exact) for a float, ``NaN`` for None (a NaN stored), ``±Infinity``."""
    if value is None or math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)
