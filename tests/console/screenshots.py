"""Screenshots of every console page against the demo dataset, for ``docs/img``.

    .venv/bin/python -m tests.console.screenshots [DIRECTORY]   (default: docs/img)

Uses the browser tests' set-up: the live node (:mod:`tests.console.live`) seeded with the
demo hour (:mod:`tests.console.demo`) and Debian's Chromium through Playwright.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

from engine.api.schedule_input import paused
from engine.ledger.params import SchedulesUpdate
from tests.console.browser import chromium, new_page, sign_in
from tests.console.live import LiveNode, chromium_path

PAGES: Final = (
    ("overview", "/ui/overview"),
    ("forecast", "/ui/forecast"),
    ("schedules", "/ui/schedules?tenant_id=acme"),
    ("schedule", "/ui/schedules/billing-invoices-eu"),
    ("executions", "/ui/executions?schedule_id=billing-reminders"),
    ("execution", "/ui/executions/billing-reminders:2026-03-27T13:25:00Z"),
    ("dead-letters", "/ui/dead-letters"),
    ("cluster", "/ui/cluster"),
)


def main(directory: Path) -> None:
    executable = chromium_path()
    if executable is None:
        raise SystemExit("no Chromium: apt-get install chromium")
    directory.mkdir(parents=True, exist_ok=True)
    node = LiveNode().start()
    node.run(_pause, node, "acme-sync-03")
    try:
        with chromium(executable) as browser, new_page(browser, node.url) as page:
            page.goto("/ui/login")
            page.screenshot(path=directory / "console-login.png")
            sign_in(page, node.tokens["admin"])
            for name, path in PAGES:
                page.goto(path)
                page.screenshot(path=directory / f"console-{name}.png", full_page=True)
            page.goto("/ui/dead-letters")
            for box in page.locator('input[name="execution_id"]').all()[:2]:
                box.check()
            page.get_by_role("button", name="Replay selected…").click()
            page.screenshot(path=directory / "console-replay-confirm.png", full_page=True)
    finally:
        node.stop()
    print(f"screenshots in {directory}")


async def _pause(node: LiveNode, schedule_id: str) -> None:
    current = await node.ledger.schedules_get(schedule_id)
    await node.ledger.schedules_update(SchedulesUpdate(paused(current), current.version))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img"))
