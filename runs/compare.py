"""The Compare page (docs/design/interfaces.md#workspace): selected Runs of a Project side by side.

Every metric key any of them logged is one chart with one series per Run
(colour = its position in the selection), the parameters in one table
(by default only the keys whose values differ), and each Run's complete
checkpoints and data stages (docs/design/runs.md#data-stages) in columns. The selection is in the URL
(``?run=ID&run=ID``, or ``?run=ID,ID``), so the page can be shared.
"""

from dataclasses import dataclass

from django.db.models import Prefetch
from django.utils.translation import gettext as _

from mado.errors import NotFound, ValidationFailed
from runs import charts, selectors
from runs.models import Project, Run

MAX_RUNS = 50
_MISSING = object()


@dataclass(frozen=True)
class ParameterRow:
    """One parameter: its value in each compared Run (``None`` where unset) and whether they differ."""

    name: str
    values: list
    differs: bool


@dataclass(frozen=True)
class Comparison:
    """What the Compare page shows; ``runs`` in selection order, ``chart_data`` the uPlot payload."""

    runs: list[Run]
    charts: list
    chart_data: dict
    parameters: list[ParameterRow]
    same_parameters: int
    checkpoints: list[list]
    stages: list[list[dict]]


def parse_run_ids(values: list[str]) -> list[int]:
    """The Run ids of the ``run`` GET values (each one id or ids joined by commas), duplicates dropped.

    Raises ``ValidationFailed`` (field ``run``) for a value that is not an id or more than ``MAX_RUNS`` runs.
    """
    ids = []
    for value in values:
        for part in value.split(","):
            if not part.strip():
                continue
            if not part.strip().isdigit():
                raise ValidationFailed(_("'%(value)s' is not a run id") % {"value": part}, field="run")
            if int(part) not in ids:
                ids.append(int(part))
    if len(ids) > MAX_RUNS:
        raise ValidationFailed(
            _("compare at most %(max)s runs at once (%(count)s selected)") % {"max": MAX_RUNS, "count": len(ids)},
            field="run",
        )
    return ids


def parameter_rows(runs: list[Run]) -> list[ParameterRow]:
    """One ``ParameterRow`` per parameter name any of ``runs`` has, by name."""
    names = sorted({name for run in runs for name in run.parameters or {}})
    rows = []
    for name in names:
        values = [(run.parameters or {}).get(name, _MISSING) for run in runs]
        differs = len({repr(v) for v in values}) > 1
        rows.append(ParameterRow(name=name, values=[None if v is _MISSING else v for v in values], differs=differs))
    return rows


def run_comparison(*, user, project: Project, run_ids: list[str], all_parameters: bool = False) -> Comparison:
    """The ``Comparison`` of the Runs ``run_ids`` (GET values, ``parse_run_ids``) of ``project``.

    Raises ``ValidationFailed`` (field ``run``) for a malformed or too long selection and ``NotFound`` when an
    id is not a Run of ``project`` visible to ``user`` (404, as for any invisible object).
    """
    ids = parse_run_ids(run_ids)
    # The reverse relation of the checkpoints app's model: read here without importing that app.
    checkpoints = Run._meta.get_field("checkpoints").related_model.objects.filter(state="complete").order_by("step")
    found = {
        run.pk: run
        for run in Run.objects.visible_to(user)
        .filter(project=project, pk__in=ids)
        .select_related("created_by")
        .prefetch_related(Prefetch("checkpoints", queryset=checkpoints, to_attr="complete_checkpoints"))
    }
    missing = [i for i in ids if i not in found]
    if missing:
        raise NotFound(
            _("run %(id)s not found in project '%(project)s'") % {"id": missing[0], "project": project.slug},
            field="run",
        )
    runs = [found[i] for i in ids]
    chart_list = charts.runs_charts(runs=runs, max_points=max(charts.MAX_POINTS // max(len(runs), 1), 100))
    rows = parameter_rows(runs)
    shown = rows if all_parameters else [row for row in rows if row.differs]
    return Comparison(
        runs=runs,
        charts=chart_list,
        chart_data=charts.chart_data(chart_list),
        parameters=shown,
        same_parameters=sum(1 for row in rows if not row.differs),
        checkpoints=[run.complete_checkpoints for run in runs],
        stages=selectors.data_stage_histories(runs=runs),
    )
