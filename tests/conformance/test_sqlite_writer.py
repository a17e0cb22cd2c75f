"""The SQLite sink's writer process (``sinks/sqlite_writer.py``): it dies with its
worker and never outlives it, survives the signals a shutdown sends, and a writer
that died is a non-retriable store error, never a write reported done."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stepstream.errors import SinkError, SinkUnavailable
from stepstream.sinks import open_step_store
from stepstream.sinks.sqlite import SqliteStepStore
from stepstream.sinks.sqlite_writer import request

from sink_support import run, state, step



def writer_pid(store: SqliteStepStore) -> int:
    pid = store._db._writer.pid  # type: ignore[union-attr]
    assert pid is not None
    return pid


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def stored_seqs(path: Path) -> list[int]:
    with sqlite3.connect(path) as conn:
        return [s for (s,) in conn.execute("SELECT step_seq FROM run_steps ORDER BY step_seq")]


async def test_a_write_round_trips_through_the_writer_process(tmp_path):
    store = await open_step_store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        pid = writer_pid(store)
        assert pid != os.getpid() and alive(pid)
        skipped = await store.write([step(0), step(1)], [run()], [state(last_seq=1)])
        assert skipped == []
        # A stale state comes back as the refused run, through the reply.
        assert await store.write([step(0)], [run()], [state(last_seq=0)]) == [("acme", "r1")]
    finally:
        await store.close()
    assert stored_seqs(tmp_path / "s.db") == [0, 1]
    assert wait_gone(pid), "the writer process outlived its store"


async def test_a_writer_that_died_makes_the_next_write_a_non_retriable_error(tmp_path):
    store = await open_step_store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        await store.write([step(0)], [run()], [state(last_seq=0)])
        os.kill(writer_pid(store), signal.SIGKILL)
        with pytest.raises(SinkError) as failure:
            await store.write([step(1)], [run()], [state(last_seq=1)])
        assert not isinstance(failure.value, SinkUnavailable)
        assert "writer process exited" in str(failure.value)
    finally:
        await store.close()
    assert stored_seqs(tmp_path / "s.db") == [0]


async def test_the_writer_ignores_sigterm_and_sigint_so_a_shutdown_can_still_write(tmp_path):
    store = await open_step_store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        pid = writer_pid(store)
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGINT)
        await asyncio.sleep(0.2)
        assert alive(pid)
        await store.write([step(0)], [run()], [state(last_seq=0)])
    finally:
        await store.close()
    assert stored_seqs(tmp_path / "s.db") == [0]


def test_the_writer_exits_when_its_worker_is_killed(tmp_path):
    """SIGKILL of the owning process closes the writer's stdin: it exits, it is not orphaned."""
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from stepstream.sinks import open_step_store
        async def main():
            store = await open_step_store("sqlite:///{tmp_path / 's.db'}")
            print(store._db._writer.pid, flush=True)
            await asyncio.sleep(600)
        asyncio.run(main())
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        pid = int(owner.stdout.readline())
        assert alive(pid)
        owner.kill()
        owner.wait(10)
        assert wait_gone(pid), "the writer process outlived its killed worker"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)
        if owner.stdout is not None:
            owner.stdout.close()


def test_a_request_falls_back_to_pickle_only_for_what_messagepack_cannot_hold():
    # A frame: the 8-byte length of the body, then the body's format byte.
    frame = request("write_steps", ([step(0)], [run()], [state()]))
    assert frame[8:9] == b"m" and int.from_bytes(frame[:8], "big") == len(frame) - 8
    assert request("write_steps", ([step(0, input_shape="x\ud800")], [], []))[8:9] == b"p"
    assert request("write_steps", ([], [run(input_tokens=2**70)], []))[8:9] == b"p"
