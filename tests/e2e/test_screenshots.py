"""Screenshots of the workspace for the notes (docs/design/interfaces.md#workspace, #system-metrics): the runs table,
Compare and the System tab of a seeded project at 1400×900, written to
var/screenshots/{runs-table,compare,system-tab}.png.

Each page must fit the window (no horizontal scroll) and show its charts drawn, so a layout that breaks fails
here rather than in a picture nobody opens.
"""

from pathlib import Path

import pytest
from django.conf import settings
from playwright.sync_api import expect

from tests.e2e.helpers import log_in
from tests.e2e.test_workspace import _project

WIDTH, HEIGHT = 1400, 900


def _shot(page, name: str) -> Path:
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH, name
    folder = Path(settings.BASE_DIR) / "var" / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path))
    assert path.stat().st_size > 20_000  # a drawn page, not a blank one
    return path


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_screenshots_of_the_runs_table_compare_and_system_tab(browser_page):
    page = browser_page
    page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
    project, last = _project()
    log_in(page, "erin", f"/projects/{project.slug}/?sort=metric:train.loss:last")
    expect(page.locator("table.runs tbody tr")).to_have_count(4)
    for name in ("lr-0.1", "lr-0.01", "lr-0.001"):
        page.get_by_label(f"Select {name}").check()
    _shot(page, "runs-table")

    page.get_by_role("button", name="Compare selected").click()
    chart = page.locator('figure.metric-chart[data-key="train.loss"]')
    expect(chart.locator(".uplot")).to_be_visible()
    box = chart.locator(".u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.7, box["y"] + box["height"] / 2)  # legend shows the values
    _shot(page, "compare")

    page.goto(f"/runs/{last.pk}/system/")
    expect(page.locator("figure.metric-chart .uplot")).to_have_count(4)
    memory = page.locator('figure.metric-chart[data-key="system/gpu0/memory_used_bytes"]')
    assert "GiB" in memory.evaluate("figure => figure.chart.axes[1]._values.join(' ')")  # bytes, not "16B"
    box = memory.locator(".u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] / 2)
    expect(memory.locator(".u-legend .u-series").nth(1).locator(".u-value")).to_contain_text("GiB")
    _shot(page, "system-tab")
