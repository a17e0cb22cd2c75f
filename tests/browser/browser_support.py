"""What the viewer's browser tests share: the API served on a free port, a watched page
(see conftest.py for the fixtures). A module name of its own: several test folders
have a conftest.py on sys.path, so ``from conftest import`` would be ambiguous."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
from playwright.sync_api import BrowserContext, ConsoleMessage, Page

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))  # api_support: the canary corpus

from stepstream.api.app import create_app  # noqa: E402
from stepstream.api.tokens import TokenRegistry  # noqa: E402
from stepstream.metrics import ApiMetrics  # noqa: E402
from stepstream.sinks.ports import DeepStore, StepStore  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
T = TypeVar("T")


class ViewerServer:
    """The API app over stores, served by uvicorn on a free port in a thread with its
    own event loop. ``stores`` is the pair, or a coroutine function that opens them on
    that loop (a SQLite store belongs to the loop that opened it; those are closed at
    exit). ``call`` runs a coroutine on the server's loop (to write to its stores)."""

    def __init__(
        self,
        stores: tuple[StepStore, DeepStore] | Callable[[], Awaitable[tuple[StepStore, DeepStore]]],
        tokens_file: Path,
        **app_options: Any,
    ) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.stores, self.tokens_file, self.app_options = stores, tokens_file, app_options
        self.owned = callable(stores)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="viewer-server", daemon=True)

    def __enter__(self) -> ViewerServer:
        self.thread.start()
        opened = self.call(self.stores()) if callable(self.stores) else self.stores
        self.steps, self.deep = opened
        self.app = create_app(self.steps, self.deep, TokenRegistry(self.tokens_file), ApiMetrics(), **self.app_options)
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_config=None, access_log=False, lifespan="off",
            timeout_graceful_shutdown=1,
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.serving = asyncio.run_coroutine_threadsafe(self.server.serve(), self.loop)
        for _ in range(200):
            if self.server.started:
                return self
            if self.serving.done():
                break
            threading.Event().wait(0.05)
        raise AssertionError(f"the API did not start on {self.base_url}")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.serving.result(timeout=10)
        if self.owned:
            self.call(self.deep.close())
            self.call(self.steps.close())
        self.call(self.loop.shutdown_asyncgens())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()

    def call(self, coroutine: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)  # type: ignore[arg-type]


class Watched:
    """A page and everything its console and page errors said (to assert nothing leaked
    and no CSP violation happened)."""

    def __init__(self, context: BrowserContext) -> None:
        self.context = context
        self.page: Page = context.new_page()
        self.console: list[str] = []
        self.page.on("console", self._on_console)
        self.page.on("pageerror", lambda exc: self.console.append(f"pageerror: {exc}"))

    def _on_console(self, message: ConsoleMessage) -> None:
        self.console.append(f"{message.type}: {message.text}")

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path
