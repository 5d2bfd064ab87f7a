"""``/api/v1/docs/`` renders Swagger UI with the network cut off: every file comes from this server
(docs/design/interfaces.md#surfaces)."""

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from tests.e2e.helpers import log_in
from tests.factories import UserFactory


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_api_docs_render_offline(browser_page, live_server):
    page = browser_page
    UserFactory(username="erin")
    local = urlsplit(live_server.url).netloc
    blocked = []

    def only_local(route):
        if urlsplit(route.request.url).netloc == local or route.request.url.startswith("data:"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    page.context.route("**/*", only_local)
    log_in(page, "erin", "/api/v1/docs/")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("mado API")
    expect(page.locator(".swagger-ui .opblock").first).to_be_visible()
    assert blocked == []
