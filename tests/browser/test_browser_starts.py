"""The browser the viewer's tests drive starts, is the system's Chromium, and reaches
an API served on 127.0.0.1 (a secure origin: ``isSecureContext``)."""

from __future__ import annotations

from conftest import CHROMIUM, ViewerServer
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore


def test_the_system_chromium_starts_and_reaches_the_api(browser, watched, tmp_path):
    assert browser.version.split(".")[0].isdigit()
    with ViewerServer(MemoryStepStore(), MemoryDeepStore(), tmp_path / "tokens.json") as server:
        view = watched()
        answer = view.page.goto(f"{server.base_url}/healthz")
        assert answer is not None and answer.status == 200
        assert view.page.evaluate("window.isSecureContext") is True
    assert CHROMIUM.endswith("chromium")
