"""The workspace in a real browser (docs/design/interfaces.md#workspace, #system-metrics): sort the runs table by a
metric, select three runs, Compare, hover a chart and read the three values in its legend, zoom and reset, log scale,
smoothing; the System tab."""

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from runs.metrics import metrics_ingest
from runs.models import Role, RunStatus
from tests.e2e.helpers import log_in, screenshot
from tests.factories import MembershipFactory, ProjectFactory, RunFactory, UserFactory

LOSSES = {"lr-0.1": 0.3, "lr-0.01": 0.1, "lr-0.001": 0.2, "lr-1.0": 0.9}


def _project():
    project = ProjectFactory(name="Vision", slug="vision")
    user = UserFactory(username="erin")
    MembershipFactory(user=user, project=project, role=Role.MEMBER)
    for hours, (name, end) in enumerate(LOSSES.items(), start=1):
        started = timezone.now() - timedelta(hours=hours)
        run = RunFactory(
            project=project,
            created_by=user,
            name=name,
            status=RunStatus.FINISHED,
            parameters={"lr": float(name[3:]), "batch": 64},
            started_at=started,
            ended_at=started + timedelta(minutes=17 * hours),
        )
        metrics_ingest(
            actor=user,
            run=run,
            points=[{"key": "train.loss", "value": end + (99 - s) / 50, "step": s} for s in range(100)]
            + [{"key": "val.acc", "value": 1 - end, "step": s} for s in range(0, 100, 10)],
        )
    system = [
        ("system/cpu_percent", lambda s: 60 + 30 * (s % 7 == 0)),
        ("system/memory_percent", lambda s: 40 + s / 5),
        ("system/gpu0/utilization_percent", lambda s: 95 - 80 * (s % 9 == 0)),
        ("system/gpu0/memory_used_bytes", lambda s: 2**30 * (10 + s / 20)),
    ]
    metrics_ingest(
        actor=user,
        run=run,
        points=[{"key": key, "value": value(s), "step": s} for key, value in system for s in range(0, 100, 3)],
    )
    return project, run


def _legend_values(chart) -> list[str]:
    """The values uPlot's legend shows for each Run (the first row is the x axis)."""
    return chart.locator(".u-legend .u-series:not(.raw) .u-value").all_inner_texts()[1:]


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_sort_select_compare_hover_zoom_and_log_scale(browser_page):
    page = browser_page
    project, last = _project()
    log_in(page, "erin", f"/projects/{project.slug}/")

    # The runs table: default columns (lr varies, the two shared metrics), sorted by the last loss.
    header = page.locator('th[data-column="metric:train.loss:last"] a')
    expect(header).to_be_visible()
    header.click()
    expect(page.locator("table.runs tbody tr td:nth-child(2) a")).to_have_text(
        ["lr-0.01", "lr-0.001", "lr-0.1", "lr-1.0"]
    )
    page.locator('th[data-column="metric:train.loss:last"] a').click()  # again: descending
    expect(page.locator("table.runs tbody tr td:nth-child(2) a").first).to_have_text("lr-1.0")
    screenshot(page, "runs-table")

    for name in ("lr-0.1", "lr-0.01", "lr-0.001"):
        page.get_by_label(f"Select {name}").check()
    page.get_by_role("button", name="Compare selected").click()
    expect(page.get_by_role("heading", name="Compare runs")).to_be_visible()
    expect(page.locator("ul.compare-runs li")).to_have_count(3)
    expect(page.locator('table.params-diff tr[data-parameter="lr"]')).to_be_visible()
    expect(page.locator('table.params-diff tr[data-parameter="batch"]')).to_have_count(0)

    chart = page.locator('figure.metric-chart[data-key="train.loss"]')
    over = chart.locator(".u-over")
    expect(over).to_be_visible()
    box = over.bounding_box()
    page.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)  # the last step: 99
    expect(chart.locator(".u-legend .u-series").first.locator(".u-value")).to_have_text("99")
    assert sorted(float(v) for v in _legend_values(chart)) == [0.1, 0.2, 0.3]
    screenshot(page, "compare")

    # Drag-zoom to the first half, then reset.
    page.mouse.move(box["x"] + 5, box["y"] + 20)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 40, steps=5)
    page.mouse.up()
    zoomed = page.evaluate("document.querySelector('figure.metric-chart[data-key=\"train.loss\"]').chart.scales.x")
    assert zoomed["max"] < 60
    chart.get_by_role("button", name="Reset zoom").click()
    full = page.evaluate("document.querySelector('figure.metric-chart[data-key=\"train.loss\"]').chart.scales.x")
    assert full["min"] == 0 and full["max"] == 99

    # Log scale: the y scale's distribution becomes logarithmic and the hover values stay.
    page.get_by_label("Log scale (y)").check()
    distr = page.evaluate("document.querySelector('figure.metric-chart[data-key=\"train.loss\"]').chart.scales.y.distr")
    assert distr == 3
    page.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)
    assert sorted(float(v) for v in _legend_values(chart)) == [0.1, 0.2, 0.3]

    # Smoothing draws the raw curves faint behind the smoothed ones (hidden from the legend).
    page.get_by_label("Smoothing", exact=True).fill("0.9")
    page.get_by_label("Smoothing", exact=True).dispatch_event("change")
    expect(chart.locator(".u-legend .u-series.raw")).to_have_count(3)
    expect(chart.locator(".chart-smoothing-value")).to_have_count(0)
    expect(page.locator(".chart-smoothing-value")).to_have_text("0.90")
    page.get_by_label("Smoothing", exact=True).fill("0")
    page.get_by_label("Smoothing", exact=True).dispatch_event("change")
    page.get_by_label("Log scale (y)").uncheck()

    # The System tab: the SDK's system/… metrics, not among the training charts.
    page.goto(f"/runs/{last.pk}/")
    expect(page.locator("figure.metric-chart")).to_have_count(2)
    page.get_by_role("link", name="System").click()
    expect(page.locator("figure.metric-chart .uplot")).to_have_count(4)
    expect(page.locator('figure.metric-chart[data-key="system/gpu0/utilization_percent"]')).to_be_visible()
    screenshot(page, "system-tab")
