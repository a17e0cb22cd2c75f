"""One conformance suite, every backend: each test here runs against ``memory``,
``file``, ``sqlite`` and ``mongodb`` (a real FerretDB that ``make test`` starts and
names in ``STEPSTREAM_TEST_MONGO_URL``; each test gets its own database).

A backend's real gap is a ``False`` in its ``capabilities``, and never a skip: a
test that needs the capability either calls ``needs(store, "capability")`` (a
strict xfail, never an isinstance), or, for a race that a backend without it
loses only sometimes (no strict xfail can hold it), is marked
``@pytest.mark.requires("capability")`` and is not generated for that backend.
What each backend reports is read from a store of it once per session, and the
summary of the run lists every gap and the tests it left out ("capability gaps").

``late_writer`` is a second writer on the same storage whose write can be held
between its read and its write (``interleave.py``): the stale partition owner.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from stepstream.sinks import DeepStore, StepStore, open_deep_store, open_step_store
from stepstream.sinks.ports import Capabilities

from interleave import LateWriter, WireGate
from sink_support import MONGO_ENV, drop_database, mongo_url

BACKENDS = ("memory", "file", "sqlite", "mongodb")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "requires(capability): generated only for the backends whose stores report the "
        "capability; the others are listed under 'capability gaps' in the summary",
    )


_capabilities: dict[str, Capabilities | None] = {}
_left_out: list[tuple[str, str, str]] = []  # (test, backend, capability)


async def _reported(backend: str, scratch: Path) -> Capabilities | None:
    """What a fresh step store of ``backend`` reports; ``None`` for mongodb without a
    server (its tests are then generated, and fail on the missing server)."""
    if backend == "mongodb" and not os.environ.get(MONGO_ENV):
        return None
    url = {
        "memory": "memory://",
        "file": f"file://{scratch / 'sink'}",
        "sqlite": f"sqlite:///{scratch / 'sink.db'}",
        "mongodb": mongo_url(os.environ.get(MONGO_ENV, ""), f"stepstream_probe_{uuid.uuid4().hex[:16]}"),
    }[backend]
    store = await open_step_store(url)
    try:
        return store.capabilities
    finally:
        await store.close()
        if backend == "mongodb":
            await drop_database(url)


def reported_capabilities(backend: str) -> Capabilities | None:
    """:func:`_reported`, once per session."""
    if backend not in _capabilities:
        with tempfile.TemporaryDirectory() as scratch:
            _capabilities[backend] = asyncio.run(_reported(backend, Path(scratch)))
    return _capabilities[backend]


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``requires(capability)`` is parametrized over the backends
    that have it (a direct parametrization of ``backend``, which takes precedence
    over the fixture's own)."""
    marker = metafunc.definition.get_closest_marker("requires")
    if marker is None or "backend" not in metafunc.fixturenames:
        return
    (capability,) = marker.args
    kept = []
    for backend in BACKENDS:
        reported = reported_capabilities(backend)
        if reported is None or getattr(reported, capability):
            kept.append(backend)
        else:
            _left_out.append((metafunc.definition.nodeid, backend, capability))
    metafunc.definition.add_marker(pytest.mark.parametrize("backend", kept))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Every backend's capability gaps, and the tests not generated for them."""
    if not _capabilities:
        return
    terminalreporter.section("capability gaps")
    for backend, reported in _capabilities.items():
        if reported is None:
            terminalreporter.line(f"{backend}: not probed (no server)")
            continue
        gaps = [name for name, value in msgspec.structs.asdict(reported).items() if not value]
        terminalreporter.line(f"{backend}: {', '.join(gaps) or 'none'}")
    for test, backend, capability in _left_out:
        terminalreporter.line(f"not generated: {test}[{backend}] (lacks {capability})")


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


@pytest.fixture
async def late_writer(
    backend: str, store_url: str, deep_store: DeepStore, step_store: StepStore
) -> AsyncIterator[LateWriter]:
    """A second writer of this test's storage (see :class:`interleave.LateWriter`)."""
    gate = await WireGate(store_url).start() if backend == "mongodb" else None
    one_instance = not deep_store.capabilities.shared_storage
    writer = LateWriter(store_url, gate, *((deep_store, step_store) if one_instance else (None, None)))
    yield writer
    await writer.close()
