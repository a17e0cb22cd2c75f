"""``stepstream.core`` is pure: no event loop, no drivers, no environment, no clock."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "services" / "stepstream" / "core"
FORBIDDEN_MODULES = {
    "asyncio", "aiokafka", "faust", "sqlite3", "aiosqlite", "pymongo", "motor", "socket",
    "subprocess", "threading", "multiprocessing", "prometheus_client", "httpx", "requests",
}  # fmt: skip
FORBIDDEN_CALLS = {("os", "environ"), ("os", "getenv"), ("os", "putenv"), ("time", "time"), ("time", "monotonic"),
                   ("datetime", "now"), ("datetime", "utcnow"), ("date", "today")}  # fmt: skip
MODULES = sorted(CORE.glob("*.py"))


def test_core_has_modules():
    names = {p.name for p in MODULES}
    assert {"fold.py", "redact.py", "caps.py", "shapes.py", "timefmt.py", "wire.py", "records.py"} <= names


def problems_in(source: str) -> list[str]:
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    problems.append(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            root = (node.module or "").split(".")[0]
            if root in FORBIDDEN_MODULES:
                problems.append(f"from {node.module} import ...")
            if root == "os" and any(a.name in ("environ", "getenv", "putenv") for a in node.names):
                problems.append("from os import environ/getenv")
            if root == "time" and any(a.name in ("time", "monotonic") for a in node.names):
                problems.append("from time import time/monotonic")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in FORBIDDEN_CALLS:
                problems.append(f"{node.value.id}.{node.attr}")
    return problems


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_module_is_pure(path):
    assert problems_in(path.read_text()) == [], path.name


def test_the_scan_catches_what_it_should():
    bad = (
        "import asyncio\nimport aiokafka.producer\nfrom faust import App\nfrom os import environ\n"
        "import os\nx = os.environ['A']\nimport time\ny = time.time()\nfrom datetime import datetime\n"
        "z = datetime.now()\nimport sqlite3, aiosqlite, pymongo\n"
    )
    assert sorted(problems_in(bad)) == sorted(
        [
            "import asyncio",
            "import aiokafka.producer",
            "from faust import ...",
            "from os import environ/getenv",
            "os.environ",
            "time.time",
            "datetime.now",
            "import sqlite3",
            "import aiosqlite",
            "import pymongo",
        ]
    )
    assert problems_in("import msgspec\nfrom datetime import datetime\nimport re\n") == []


def _core_imports(path: Path) -> set[str]:
    """The ``stepstream.core`` modules ``path`` imports, also under ``TYPE_CHECKING``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stepstream.core."):
            names.add(node.module.rsplit(".", 1)[1])
    return names


def test_core_imports_form_no_cycle():
    """Data flows one way: no core module reaches back (``caps``, ``steps`` and the
    sinks read their numbers from ``core.limits``, never from the state machine)."""
    graph = {path.stem: _core_imports(path) for path in MODULES}
    assert "fold" not in graph["caps"] | graph["steps"] | graph["limits"]

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        for name in graph.get(start, ()):
            if name == target or (name not in seen and reaches(name, target, seen | {name})):
                return True
        return False

    assert [name for name in graph if reaches(name, name, set())] == []


def test_sinks_take_limits_from_core_limits():
    sinks = CORE.parent / "sinks"
    for path in sorted(sinks.glob("*.py")):
        assert "stepstream.core.fold" not in path.read_text(), path.name
