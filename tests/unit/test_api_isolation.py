"""The operator routes cannot reach the deep store: the modules that serve
``GET .../runs`` and ``GET .../runs/{run_id}`` and the viewer's operator pages import
no deep store type, backend or route, and the routes work with a deep store that
refuses every call."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import httpx

from stepstream.api.app import create_app
from stepstream.api.tokens import TokenRegistry, add_token
from stepstream.core.records import RunRecord, StepRecord
from stepstream.metrics import ApiMetrics
from stepstream.sinks.memory import MemoryStepStore

API = Path(__file__).resolve().parents[2] / "services" / "stepstream" / "api"
# The operator routes and the viewer's operator pages (issue 24): only ui/raw.py may read bodies.
STEP_SERVING = (
    "steps.py", "views.py", "ui/pages.py", "ui/live.py", "ui/present.py", "ui/session.py", "ui/signin.py",
)  # fmt: skip
DEEP_WORDS = ("deep", "retention", "open_deep_store", "sqlite", "mongodb", "files", "memory", "factory")


def imported_names(source: str) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names += [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def deep_imports(source: str) -> list[str]:
    return [n for n in imported_names(source) if any(w in n.lower() for w in DEEP_WORDS)]


def test_step_serving_modules_import_nothing_of_the_deep_store():
    for name in STEP_SERVING:
        assert deep_imports((API / name).read_text()) == [], name


def test_the_scan_catches_deep_imports():
    bad = "from stepstream.sinks.ports import DeepStore, StepStore\nimport stepstream.api.deep\nfrom stepstream.sinks import open_deep_store\n"
    assert deep_imports(bad) == [
        "stepstream.sinks.ports.DeepStore",
        "stepstream.api.deep",
        "stepstream.sinks.open_deep_store",
    ]


class Tripwire:
    """A deep store that fails the test if anything touches it."""

    def __getattr__(self, name):
        raise AssertionError(f"the deep store was touched: {name}")


def test_operator_routes_never_touch_the_deep_store(tmp_path):
    async def scenario():
        steps = MemoryStepStore()
        await steps.write(
            [StepRecord(company_id="acme", run_id="r1", step_seq=0, kind="tool", label="search", status="ok")],
            [RunRecord(company_id="acme", run_id="r1", started_at="2026-11-29T12:00:00.000000Z")],
        )
        token, _ = add_token(tmp_path / "t.json", "acme", ["steps:read", "deep:read"], created="x")
        app = create_app(steps, Tripwire(), TokenRegistry(tmp_path / "t.json"), ApiMetrics())  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            headers = {"Authorization": f"Bearer {token}"}
            assert (await http.get("/v1/companies/acme/runs", headers=headers)).status_code == 200
            assert (await http.get("/v1/companies/acme/runs/r1", headers=headers)).status_code == 200
            assert (await http.get("/v1/companies/acme/runs/nope", headers=headers)).status_code == 404
            for page in ("/ui/companies/acme/runs", "/ui/companies/acme/runs/r1", "/ui/companies/acme/compare?a=r1&b=r1"):
                assert (await http.get(page, headers=headers)).status_code == 200, page
            # ... while the deep route does reach it (the tripwire works): a 500 problem.
            deep = await http.get("/v1/companies/acme/runs/r1/deep", headers=headers)
            assert deep.status_code == 500 and deep.json()["type"] == "urn:stepstream:problem:internal"
            assert "touched" not in deep.text  # an internal error's text never reaches the client

    asyncio.run(scenario())
