"""The Checkpoint tab in a real browser: the newest 5 of 7, the toggle, an admin deletes an old one
(docs/design/checkpoints.md#keep-count, #deletion; docs/design/interfaces.md#surfaces)."""

import io
import os
import re

import pytest
from playwright.sync_api import expect

from checkpoints import services
from checkpoints.models import Checkpoint, CheckpointState
from runs.models import Role
from tests.checkpoints.checkpoint_helpers import declaration, make_tar
from tests.e2e.helpers import log_in, screenshot
from tests.factories import MembershipFactory, ProjectFactory, RunFactory, UserFactory


def _run_with_seven_checkpoints():
    project = ProjectFactory(name="Vision", slug="vision")
    admin = UserFactory(username="erin")
    MembershipFactory(user=admin, project=project, role=Role.ADMIN)
    run = RunFactory(project=project, created_by=admin, name="resnet-long")
    for step in range(100, 800, 100):
        files = {"model.pt": os.urandom(2048 * step), "optimizer.pt": os.urandom(512 * step)}
        tar = make_tar(files)
        checkpoint, _ = services.checkpoint_register(
            actor=admin, run=run, step=step, framework="torch", includes_optimizer=True
        )
        services.checkpoint_upload(actor=admin, checkpoint=checkpoint, source=io.BytesIO(tar), expected_size=len(tar))
        services.checkpoint_complete(actor=admin, checkpoint=checkpoint, **declaration(tar, files))
    return run


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_checkpoint_tab_shows_five_toggles_to_seven_and_an_admin_deletes_an_old_one(browser_page):
    page = browser_page
    run = _run_with_seven_checkpoints()
    log_in(page, "erin", f"/runs/{run.pk}/checkpoints/")
    rows = page.locator("table.checkpoints tbody tr")

    expect(page.get_by_role("link", name="Checkpoints", exact=True)).to_have_attribute("aria-current", "page")
    expect(rows).to_have_count(5)
    expect(rows.first).to_have_attribute("data-step", "700")
    expect(rows.first.locator("a.download")).to_have_attribute("href", re.compile(r"/api/v1/checkpoints/\d+/tar$"))
    expect(page.locator(".keep-note")).to_contain_text("The newest 5 complete checkpoints of this run: they are kept")
    expect(rows.first.locator(".badge.state-kept")).to_have_text("kept")  # the rule is said once, above the table
    expect(rows.first.get_by_role("link", name="Delete")).to_have_count(0)
    expect(rows.first).not_to_contain_text("one of the newest 5 complete checkpoints")
    screenshot(page, "checkpoint-tab")

    page.get_by_role("link", name="Show older checkpoints beyond the keep count (2)").click()
    expect(rows).to_have_count(7)
    expect(page.get_by_role("link", name="Hide older checkpoints")).to_be_visible()
    oldest = page.locator('tr[data-step="100"]')
    oldest.get_by_role("link", name="Delete").click()

    expect(page.get_by_role("heading", name="Delete the checkpoint at step 100?")).to_be_visible()
    page.get_by_role("button", name="Delete checkpoint").click()

    expect(page).to_have_url(re.compile(rf"/runs/{run.pk}/checkpoints/\?older=1$"))
    expect(page.locator(".message")).to_have_text("The checkpoint at step 100 was deleted.")
    expect(rows).to_have_count(7)
    expect(oldest).to_have_attribute("data-state", "deleted")
    expect(oldest.locator(".badge")).to_have_text("deleted")
    expect(oldest.locator("a.download")).to_have_count(0)
    expect(oldest.get_by_role("link", name="Delete")).to_have_count(0)
    assert Checkpoint.objects.get(run=run, step=100).state == CheckpointState.DELETED
    screenshot(page, "checkpoint-tab-older")

    page.get_by_role("link", name="Hide older checkpoints").click()
    expect(rows).to_have_count(5)
    expect(page.get_by_role("link", name="Show older checkpoints beyond the keep count (1)")).to_be_visible()

    page.get_by_role("button", name="日本語").click()
    expect(page.get_by_role("link", name="保持数を超える古いチェックポイントを表示 (1)")).to_be_visible()
    expect(page.locator(".keep-note")).to_contain_text("5")
    screenshot(page, "checkpoint-tab-ja")
    page.get_by_role("link", name="step 700 のチェックポイント").click()
    expect(page.get_by_role("heading", name=re.compile("step 700 のチェックポイント"))).to_be_visible()
    expect(page.locator("table.manifest tbody tr")).to_have_count(2)
    screenshot(page, "checkpoint-detail-ja")


def _fits(page, width: int) -> bool:
    page.set_viewport_size({"width": width, "height": 900})
    return page.evaluate("document.documentElement.scrollWidth") <= width


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_checkpoint_tab_fits_a_1400_px_window_and_says_a_shared_refusal_once(browser_page):
    page = browser_page
    run = _run_with_seven_checkpoints()
    MembershipFactory(user=UserFactory(username="mike"), project=run.project, role=Role.MEMBER)
    log_in(page, "erin", f"/runs/{run.pk}/checkpoints/?older=1")
    expect(page.locator("table.checkpoints tbody tr")).to_have_count(7)
    assert _fits(page, 1400), page.evaluate("document.documentElement.scrollWidth")
    page.get_by_role("button", name="日本語").click()
    expect(page.locator("table.checkpoints tbody tr")).to_have_count(7)
    assert _fits(page, 1400), page.evaluate("document.documentElement.scrollWidth")
    page.get_by_role("button", name="English").click()
    page.get_by_role("button", name="Log out").click()

    # A member may not delete: the reason is said once above the table, no row repeats it.
    log_in(page, "mike", f"/runs/{run.pk}/checkpoints/?older=1")
    rows = page.locator("table.checkpoints tbody tr")
    expect(rows).to_have_count(7)
    expect(page.locator(".delete-note")).to_have_count(1)
    expect(page.locator(".delete-note .delete-refusal")).to_have_text("Only project admins can do this.")
    expect(page.locator("table.checkpoints .deletion")).to_have_count(0)
    expect(rows.first.get_by_role("link", name="Continue training")).to_be_visible()
    assert _fits(page, 1400), page.evaluate("document.documentElement.scrollWidth")
    screenshot(page, "checkpoint-tab-member")
