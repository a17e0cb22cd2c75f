"""The stop deadline (ingest/stopping.py): it exits with status 0 and says what was
still stopping once its time is up, and never when cancelled first."""

from __future__ import annotations

import logging
import threading

from stepstream.ingest.stopping import StopDeadline, stopping_services, waiting_threads


class FakeService:
    def __init__(self, name: str, state: str, children: list[FakeService] | None = None) -> None:
        self.shortlabel = name
        self.state = state
        self._children = children or []


def test_an_armed_deadline_logs_what_is_still_stopping_and_exits_0(caplog):
    exited = threading.Event()
    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        exited.set()

    deadline = StopDeadline(0.05, lambda: "AIOKafkaConsumerThread", exit=fake_exit)
    with caplog.at_level(logging.WARNING, logger="stepstream.ingest.stopping"):
        deadline.arm()
        deadline.arm()  # once armed, arming again changes nothing
        assert exited.wait(5.0)
    assert codes == [0]
    assert "still stopping: AIOKafkaConsumerThread" in caplog.text


def test_a_cancelled_or_disabled_deadline_never_exits():
    codes: list[int] = []
    # Long enough that arm-then-cancel beats the timer on a loaded machine (0.05 s did not).
    cancelled = StopDeadline(0.5, lambda: "x", exit=codes.append)
    cancelled.arm()
    cancelled.cancel()
    disabled = StopDeadline(0.0, lambda: "x", exit=codes.append)
    disabled.arm()
    threading.Event().wait(1.0)
    assert codes == []


def test_a_description_that_raises_still_exits(caplog):
    exited = threading.Event()

    def broken() -> str:
        raise RuntimeError("boom")

    deadline = StopDeadline(0.01, broken, exit=lambda code: exited.set())
    with caplog.at_level(logging.WARNING, logger="stepstream.ingest.stopping"):
        deadline.arm()
        assert exited.wait(5.0)
    assert "could not tell" in caplog.text


def test_stopping_services_names_the_deepest_first():
    thread = FakeService("AIOKafkaConsumerThread", "stopping")
    consumer = FakeService("BatchConsumer", "stopping", [thread])
    web = FakeService("Web", "running")
    done = FakeService("Fetcher", "shutdown")
    app = FakeService("App", "stopping", [done, consumer, web])
    assert stopping_services(app) == ["AIOKafkaConsumerThread", "BatchConsumer", "App"]


def test_waiting_threads_names_the_non_daemon_threads_only():
    release = threading.Event()
    worker = threading.Thread(target=release.wait, name="stuck-consumer")
    daemon = threading.Thread(target=release.wait, name="a-daemon", daemon=True)
    worker.start()
    daemon.start()
    try:
        names = waiting_threads()
    finally:
        release.set()
        worker.join()
        daemon.join()
    assert "stuck-consumer" in names and "a-daemon" not in names
