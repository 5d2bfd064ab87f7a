"""The Reliability page in a real browser (docs/design/alerts.md#reliability): for a seeded history of failures it
shows the lost GPU-hours, the MTBF and the recommended checkpoint interval as computed by hand, and draws the
weekly chart; and a failing alert channel is shown on the Project page."""

import pytest
from playwright.sync_api import expect

from alerts.models import Channel
from runs.models import Role
from tests.alerts import history
from tests.e2e.helpers import log_in, screenshot
from tests.factories import MembershipFactory, ProjectFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_reliability_page_shows_the_hand_computed_figures_and_a_chart(browser_page):
    project = ProjectFactory(name="Vision", slug="vision")
    carol = UserFactory(username="carol")
    MembershipFactory(user=carol, project=project, role=Role.MEMBER)
    runs = history.seed_history(project, carol)
    page = browser_page

    log_in(page, "carol", "/projects/vision/")
    page.get_by_role("link", name="Reliability").click()

    expect(page.locator("#gpu-hours-lost")).to_have_text(f"{history.GPU_HOURS_LOST:.2f}")
    expect(page.locator("#mtbf")).to_have_text(f"{history.MTBF_H:.2f} h")
    expect(page.locator("#recommendation")).to_contain_text(f"trainer: every {history.YOUNG_DALY_S:.0f} s")
    expect(page.locator("#recommendation")).to_contain_text(f"would have saved {history.SAVED_GPU_H:.2f} GPU-hours")
    for name, hours in history.LOST.items():
        expect(page.locator(f"tr[data-run='{runs[name].pk}'] td.gpu-hours")).to_have_text(f"{hours:.2f}")
    expect(page.locator("tr[data-code='trainer'] td.young-daly")).to_have_text(f"{history.YOUNG_DALY_S:.0f}")
    expect(page.locator("figure.reliability-chart")).to_have_attribute("data-drawn", "2")
    expect(page.locator("figure.reliability-chart canvas")).to_have_count(1)
    screenshot(page, "reliability")


def test_a_failing_alert_channel_is_shown_on_the_project_page(browser_page):
    project = ProjectFactory(name="Vision", slug="vision")
    alice = UserFactory(username="alice")
    MembershipFactory(user=alice, project=project, role=Role.ADMIN)
    Channel.objects.create(
        project=project,
        name="oncall-hook",
        kind="webhook",
        target="https://example.org/h",
        created_by=alice,
        last_status="failed",
        last_error="HTTP 500: down",
    )
    page = browser_page

    log_in(page, "alice", "/projects/vision/")

    expect(page.locator("ul.failing-channels")).to_contain_text("Alert channel oncall-hook is failing: HTTP 500: down")
    page.get_by_role("link", name="See its deliveries").click()
    expect(page.locator("tr[data-channel='oncall-hook']")).to_have_class("failing")
    expect(page.get_by_role("button", name="Send test")).to_be_visible()
    screenshot(page, "alerts")
