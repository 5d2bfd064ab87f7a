"""Steps the browser tests share."""

import os


def log_in(page, username: str, next_url: str) -> None:
    """Log in through the login form (every test user's password is the factories' ``pw-123456``)."""
    page.goto(f"/accounts/login/?next={next_url}")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pw-123456")
    page.get_by_role("button", name="Log in").click()


def screenshot(page, name: str) -> None:
    """With ``MADO_E2E_SCREENSHOTS=DIR`` set, save the page as ``DIR/<name>.png`` for a person to look at."""
    if os.environ.get("MADO_E2E_SCREENSHOTS"):
        page.screenshot(path=os.path.join(os.environ["MADO_E2E_SCREENSHOTS"], f"{name}.png"), full_page=True)
