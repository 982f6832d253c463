"""What the browser tests and the screenshot script share: Chromium, a page, signing in."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from playwright.sync_api import Browser, Page, sync_playwright

VIEWPORT: Final = {"width": 1280, "height": 860}
ARTIFACTS: Final = Path(__file__).resolve().parents[2] / ".artifacts" / "console"
"""Where the browser tests leave their screenshots (git-ignored)."""


@contextmanager
def chromium(executable: str) -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable,
            # No setuid sandbox as root in a container; the pages are our own.
            args=["--no-sandbox", "--disable-dev-shm-usage"],
        )
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def new_page(browser: Browser, base_url: str) -> Iterator[Page]:
    context = browser.new_context(base_url=base_url, viewport=VIEWPORT)  # type: ignore[arg-type]
    context.set_default_timeout(10_000)
    try:
        yield context.new_page()
    finally:
        context.close()


def sign_in(page: Page, token: str, path: str = "/ui/") -> None:
    """Open ``path``, get sent to the sign-in form, sign in with ``token`` and come back."""
    page.goto(path)
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state()
