"""The tokens page and a Project's audit log in a real browser, in English and Japanese (docs/api.md#tokens,
#audit): a token is made, shown once, works, is revoked and stops working; the role change it leaves appears on
the audit page. Screenshots go to var/screenshots/{tokens,audit}{,-ja}.png.
"""

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings
from playwright.sync_api import expect

from runs.models import Role
from tests.factories import MembershipFactory, ProjectFactory, UserFactory

WIDTH, HEIGHT = 1400, 900


def _shot(page, name: str) -> None:
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH, name
    folder = Path(settings.BASE_DIR) / "var" / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)
    assert (folder / f"{name}.png").stat().st_size > 10_000


def _api_status(base: str, key: str, path: str = "/api/v1/projects/") -> int:
    request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request) as response:
            json.load(response)
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _log_in(page, username: str, next_url: str) -> None:
    """The login form by its fields' ids, whatever the page's language."""
    page.goto(f"/accounts/login/?next={next_url}")
    page.locator("#id_username").fill(username)
    page.locator("#id_password").fill("pw-123456")
    page.locator("form.stacked button[type=submit]").click()


def _world():
    project = ProjectFactory(name="Vision", slug="vision")
    admin, member = UserFactory(username="alice"), UserFactory(username="mike")
    MembershipFactory(user=admin, project=project, role=Role.ADMIN)
    MembershipFactory(user=member, project=project, role=Role.MEMBER)
    return project


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("language", ["en", "ja"])
def test_a_token_is_shown_once_works_and_is_revoked_and_the_audit_page_shows_who_did_what(
    browser, live_server, language
):
    project = _world()
    context = browser.new_context(
        base_url=live_server.url,
        viewport={"width": WIDTH, "height": HEIGHT},
        locale="ja-JP" if language == "ja" else "en-US",
    )
    context.set_default_timeout(15_000)
    page = context.new_page()
    suffix = "-ja" if language == "ja" else ""
    words = {
        "en": ("API tokens", "Your new token", "Audit log", "revoked"),
        "ja": ("APIトークン", "新しいトークン", "監査ログ", "失効済み"),
    }[language]
    try:
        _log_in(page, "alice", "/")
        page.locator("a.user").click()
        expect(page.locator("h1")).to_have_text(words[0])
        page.locator("#id_name").fill("laptop")
        page.locator("#id_scope").select_option("admin")
        page.locator("form.stacked button[type=submit]").click()
        expect(page.locator("section.new-token h2")).to_have_text(words[1])
        key = page.locator("pre.token-key code").inner_text()
        assert _api_status(live_server.url, key) == 200
        _shot(page, f"tokens{suffix}")
        page.reload()  # a GET: the key is not shown again
        expect(page.locator("pre.token-key")).to_have_count(0)

        request = urllib.request.Request(
            f"{live_server.url}/api/v1/projects/vision/members/mike/",
            data=json.dumps({"role": "viewer"}).encode(),
            method="PATCH",
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        assert urllib.request.urlopen(request).status == 200

        page.locator('tr[data-token="laptop"] button.danger').click()
        expect(page.locator('tr[data-token="laptop"]')).to_contain_text(words[3])
        assert _api_status(live_server.url, key) == 401

        page.goto(f"/projects/{project.slug}/")
        page.get_by_role("link", name=words[2]).click()
        row = page.locator('tr[data-action="membership.change_role"]')
        expect(row).to_contain_text("alice")
        expect(row).to_contain_text("laptop")
        expect(row).to_contain_text("member → viewer")
        _shot(page, f"audit{suffix}")
    finally:
        context.close()
