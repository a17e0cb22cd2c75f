"""The worker's start: phase times (``ingest.startup.StartTimes``), the process age
they are measured from, and the table manager that does not sleep a second."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import faust
import pytest
from prometheus_client import CollectorRegistry, Gauge

from stepstream.ingest.startup import PHASES, StartTimes, TablelessManager, process_age


def _gauge() -> Gauge:
    return Gauge("start_seconds", "test", ["phase"], registry=CollectorRegistry())


def _value(gauge: Gauge, phase: str) -> float:
    return gauge.labels(phase)._value.get()


def test_each_phase_is_marked_once_and_exported_before_and_after_binding():
    clock = iter([0.5, 0.7, 0.9, 5.0])
    times = StartTimes(age=lambda: next(clock))
    times.mark("imported")
    gauge = _gauge()
    times.bind(gauge)  # a phase marked before the metrics existed is exported too
    assert _value(gauge, "imported") == 0.5
    times.mark("preflight")
    times.mark("imported")  # ignored: the first end counts
    assert times.phases == {"imported": 0.5, "preflight": 0.7}
    assert _value(gauge, "preflight") == 0.7
    times.mark("first_batch")
    assert _value(gauge, "first_batch") == 0.9
    assert "imported 0.50s" in times.describe() and "first_batch 0.90s" in times.describe()


def test_an_unknown_phase_is_refused():
    with pytest.raises(ValueError):
        StartTimes(age=lambda: 1.0).mark("warmup")
    assert set(PHASES) == {"imported", "preflight", "topics", "stores", "assigned", "first_batch"}


def test_process_age_counts_from_the_process_start_and_moves_with_the_clock():
    before = process_age()
    time.sleep(0.2)
    after = process_age()
    assert before > 0
    assert 0.15 <= after - before <= 1.0
    # A fresh interpreter is young; this one (pytest started before this test) is older.
    child = subprocess.run(
        [sys.executable, "-c", "from stepstream.ingest.startup import process_age; print(process_age())"],
        capture_output=True, text=True, check=True,
    )
    young = float(child.stdout)
    assert 0 <= young < process_age()


async def _start_manager(app: faust.App, monkeypatch) -> list[str]:
    calls: list[str] = []
    manager = app.tables
    assert isinstance(manager, TablelessManager)

    async def channels() -> None:
        calls.append("channels")

    class Recovery:
        async def start(self) -> None:
            calls.append("recovery")

    monkeypatch.setattr(manager, "_update_channels", channels)
    monkeypatch.setattr(type(manager), "recovery", property(lambda self: Recovery()))
    started = time.perf_counter()
    await manager.on_start()
    calls.append(f"{time.perf_counter() - started:.3f}")
    return calls


def test_without_tables_the_manager_registers_at_once(monkeypatch):
    app = faust.App("startup-test", TableManager=TablelessManager)
    calls = asyncio.run(_start_manager(app, monkeypatch))
    assert calls[:2] == ["channels", "recovery"]
    assert float(calls[2]) < 0.5  # faust's own waits 1 s before it registers


def test_with_a_table_the_manager_is_fausts_own(monkeypatch):
    app = faust.App("startup-test-tables", TableManager=TablelessManager)
    app.Table("counts", default=int)
    seen: list[str] = []

    async def fausts(self) -> None:
        seen.append("faust's on_start")

    monkeypatch.setattr(faust.tables.TableManager, "on_start", fausts)
    asyncio.run(app.tables.on_start())
    assert seen == ["faust's on_start"]
