"""One conformance suite, every backend: each test here runs against ``memory``,
``file``, ``sqlite`` and ``mongodb`` (a real FerretDB that ``make test`` starts and
names in ``STEPSTREAM_TEST_MONGO_URL``; each test gets its own database).

A backend's real gap is a ``False`` in its ``capabilities`` and the test that
needs it calls ``needs(store, "capability")``: a strict xfail, never an isinstance.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from stepstream.sinks import DeepStore, StepStore, open_deep_store, open_step_store

from sink_support import MONGO_ENV, drop_database, mongo_url

BACKENDS = ("memory", "file", "sqlite", "mongodb")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def store_url(backend: str, tmp_path: Path) -> AsyncIterator[str]:
    """A URL naming fresh, empty storage for this test."""
    if backend == "memory":
        yield "memory://"
    elif backend == "file":
        yield f"file://{tmp_path / 'sink'}"
    elif backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'sink.db'}"
    else:
        base = os.environ.get(MONGO_ENV)
        if not base:
            pytest.fail(
                f"{MONGO_ENV} is not set: the mongodb conformance tests need the FerretDB "
                "server that `make test` starts; run them via `make test` "
                f"(or start one and export {MONGO_ENV}=mongodb://127.0.0.1:PORT/)"
            )
        url = mongo_url(base, f"stepstream_test_{uuid.uuid4().hex[:16]}")
        yield url
        await drop_database(url)


@pytest.fixture
async def open_steps(store_url: str) -> AsyncIterator[Callable[[], Awaitable[StepStore]]]:
    """Opens step stores on this test's URL (each call a new instance); closes them all."""
    opened: list[StepStore] = []

    async def open_() -> StepStore:
        store = await open_step_store(store_url)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        await store.close()


@pytest.fixture
async def open_deep(store_url: str) -> AsyncIterator[Callable[[], Awaitable[DeepStore]]]:
    opened: list[DeepStore] = []

    async def open_() -> DeepStore:
        store = await open_deep_store(store_url)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        await store.close()


@pytest.fixture
async def step_store(open_steps: Callable[[], Awaitable[StepStore]]) -> StepStore:
    return await open_steps()


@pytest.fixture
async def deep_store(open_deep: Callable[[], Awaitable[DeepStore]]) -> DeepStore:
    return await open_deep()


@pytest.fixture
def needs(request: pytest.FixtureRequest) -> Callable[[object, str], None]:
    """``needs(store, "shared_storage")``: strict xfail when the backend lacks it."""

    def check(store: object, capability: str) -> None:
        if not getattr(store.capabilities, capability):  # type: ignore[attr-defined]
            request.applymarker(pytest.mark.xfail(strict=True, reason=f"backend lacks capability {capability}"))

    return check
