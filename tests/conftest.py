"""Fixtures for every test directory."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

# Directories whose tests start servers, event loops or sockets: an object they leak (an
# asyncio transport left open) is collected here, so its warning names the test that
# leaked it rather than whichever test the garbage collector happened to run in.
_COLLECTED = {"integration", "service", "browser", "deploy"}
_TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _collect_at_teardown(request: pytest.FixtureRequest):
    yield
    if request.node.path.resolve().relative_to(_TESTS).parts[0] in _COLLECTED:
        gc.collect()
