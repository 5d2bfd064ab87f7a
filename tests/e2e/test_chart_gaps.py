"""Charts in a real browser where Runs have no point at some x (docs/design/interfaces.md#workspace): smoothing draws
every Run's curve, and a Run without metrics draws no chart and raises no script error."""

import pytest
from playwright.sync_api import expect

from runs.metrics import metrics_ingest
from runs.models import Role, RunStatus
from tests.e2e.helpers import log_in
from tests.factories import MembershipFactory, ProjectFactory, RunFactory, UserFactory

SMOOTHED = """(() => {
  const u = document.querySelector('figure.metric-chart[data-key="train.loss"]').chart;
  return [1, 2].map(i => u.data[i].filter(v => Number.isFinite(v)).length);
})()"""


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_smoothing_draws_runs_whose_steps_do_not_overlap_and_an_empty_run_page_has_no_script_error(browser_page):
    page = browser_page
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    project = ProjectFactory(name="Vision", slug="vision")
    user = UserFactory(username="erin")
    MembershipFactory(user=user, project=project, role=Role.MEMBER)
    first, second, empty = (
        RunFactory(project=project, created_by=user, name=name, status=RunStatus.FINISHED)
        for name in ("steps-0-49", "steps-50-99", "no-metrics")
    )
    for run, steps in ((first, range(50)), (second, range(50, 100))):  # a resumed chain: no step in common
        metrics_ingest(
            actor=user, run=run, points=[{"key": "train.loss", "value": 1 / (s + 1), "step": s} for s in steps]
        )

    log_in(page, "erin", "/projects/vision/")
    expect(page.get_by_role("heading", name="Vision")).to_be_visible()
    page.goto(f"/projects/vision/compare/?run={first.pk}&run={second.pk}")
    expect(page.locator('figure.metric-chart[data-key="train.loss"] .uplot')).to_be_visible()
    assert page.evaluate(SMOOTHED) == [50, 50]
    page.get_by_label("Smoothing", exact=True).fill("0.9")
    page.get_by_label("Smoothing", exact=True).dispatch_event("change")
    expect(page.locator('figure.metric-chart[data-key="train.loss"] .u-legend .u-series.raw')).to_have_count(2)
    assert page.evaluate(SMOOTHED) == [50, 50]  # each Run's 50 points smoothed; none became NaN at the other's steps

    for path in (f"/runs/{empty.pk}/", f"/runs/{empty.pk}/system/"):
        page.goto(path)
        expect(page.get_by_role("heading", name="no-metrics")).to_be_visible()
    assert errors == []
