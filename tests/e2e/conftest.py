"""Browser tests: Playwright drives Debian's Chromium against pytest-django's ``live_server``.

They run wherever /usr/bin/chromium exists and always in CI (``CI`` set),
where a missing browser is a failure, not a skip.
"""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from celery import current_app

# Playwright's sync API keeps an event loop running in this thread; Django
# would otherwise refuse ORM calls from the test body.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing; CI must run the browser tests (apt-get install chromium)")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium); CI runs these tests")
    from playwright.sync_api import expect, sync_playwright

    # An assertion waits for its condition as long as an action does (the contexts' 15 s), not Playwright's 5 s:
    # on a loaded 2-core CI machine Swagger UI alone takes longer than 5 s to fetch and render the schema.
    expect.set_options(timeout=15_000)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def browser_page(browser, live_server):
    """A fresh browser context (no cookies) whose relative URLs go to the live server."""
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 1000}, locale="en-US")
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def sent_tasks(monkeypatch):
    """Celery's ``send_task`` and ``revoke`` recorded instead of sent: pages launch Jobs without a worker."""
    sent = []
    monkeypatch.setattr(
        current_app,
        "send_task",
        lambda name, args=None, **kw: sent.append((name, args, kw)) or SimpleNamespace(id=kw.get("task_id")),
    )
    monkeypatch.setattr(current_app.control, "revoke", lambda task_id, **kw: None)
    return sent
