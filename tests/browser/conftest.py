"""Fixtures of the viewer's browser tests: one Chromium and one API server per module.

The browser is Debian's ``chromium`` (``deploy/chromium/chromium.sh`` installs it when
missing; ``deploy/run-tests.sh`` calls it), driven by Playwright for Python through
``executable_path``: nothing downloads a browser. A browser that cannot start fails
every test that needs it, with the reason; it never skips. Plain fixtures, not
pytest-playwright (whose 0.10 warns under pytest 9, and warnings are errors here).
The browser is per module, not per session: Playwright's sync API keeps an event
loop running in the main thread while it is open, and pytest-asyncio cannot run the
async tests of later modules beside it. The viewer's tests are one module, so the
suite starts one browser.

The API runs under uvicorn in a thread of its own (its own event loop) on a free port
of ``127.0.0.1``, which Chromium treats as a secure origin, so the viewer's
``__Host-`` cookie (Secure) works over plain HTTP as it does after ``make run``.
Screenshots go to ``tests/browser/artifacts/`` (gitignored), kept after the run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from playwright.sync_api import Browser, BrowserContext, Error, sync_playwright

from browser_support import CHROMIUM, Watched


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        try:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], timeout=30_000)
        except Error as exc:
            pytest.fail(
                f"Chromium at {CHROMIUM} does not start ({exc.message.splitlines()[0]}): run "
                "deploy/chromium/chromium.sh ensure (make test does), or set CHROMIUM",
                pytrace=False,
            )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def watched(browser: Browser) -> Iterator[Callable[[], Watched]]:
    """A factory of fresh browser contexts (no shared cookies), closed after the test."""
    contexts: list[BrowserContext] = []

    def make() -> Watched:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(5_000)
        contexts.append(context)
        return Watched(context)

    yield make
    for context in contexts:
        context.close()
