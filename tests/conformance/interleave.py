"""Forcing the interleaving a stale writer needs: its write paused between what it
read and what it writes, while another writer lands a newer write.

A backend whose write is one atomic step (memory: one synchronous step; files: one
``flock``; SQLite: one transaction) has no such window: :class:`AtomicWrite` runs
the late write whole, after the newer one. A backend reached over the MongoDB wire
protocol reads and then writes in separate commands: :class:`WireGate` is a TCP
proxy in front of the server that holds the late writer's first write command
(``insert`` or ``update``) of a collection until the test lets it go, so the newer
write lands between that writer's read and its write, every time.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import bson

from stepstream.sinks import DeepStore, StepStore, open_deep_store, open_step_store

OP_MSG = 2013


class Pause(Protocol):
    """A late write, started and held between its read and its write."""

    async def hold(self, write: Callable[[], Awaitable[Any]]) -> None:
        """Start ``write`` and return once it is held (it has read, it has not written)."""

    async def release(self) -> Any:
        """Let the held write finish; its result."""


class AtomicWrite:
    """For a backend whose write is one atomic step: nothing can be held inside it,
    so the late write runs whole on :meth:`release` (after the newer write)."""

    def __init__(self) -> None:
        self._write: Callable[[], Awaitable[Any]] | None = None

    async def hold(self, write: Callable[[], Awaitable[Any]]) -> None:
        self._write = write

    async def release(self) -> Any:
        assert self._write is not None
        write, self._write = self._write, None
        return await write()


class WireGate:
    """A TCP proxy to a MongoDB-wire server (``url`` points at it) that can hold the
    next write command of a collection that any client sends through it."""

    def __init__(self, target_url: str) -> None:
        self._target = urlsplit(target_url)
        self._server: asyncio.Server | None = None
        self._armed: str | None = None
        self.held = asyncio.Event()  # set when an armed message is being held
        self.go = asyncio.Event()  # set to let it through
        self._pipes: set[asyncio.Task[None]] = set()
        self.url = ""

    async def start(self) -> WireGate:
        self._server = await asyncio.start_server(self._connected, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = urlunsplit((self._target.scheme, f"127.0.0.1:{port}", self._target.path, self._target.query, ""))
        return self

    async def close(self) -> None:
        self.go.set()
        if self._server is not None:
            self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def arm(self, collection: str) -> None:
        """Hold the next ``insert`` or ``update`` of ``collection`` (one message, once)."""
        self._armed = collection
        self.held.clear()
        self.go.clear()

    def pause(self, collection: str) -> Pause:
        """A :class:`Pause` holding the late write's first write of ``collection``."""
        return WirePause(self, collection)

    async def _connected(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        host, port = self._target.hostname or "127.0.0.1", self._target.port or 27017
        server_reader, server_writer = await asyncio.open_connection(host, port)
        to_server = asyncio.ensure_future(self._forward(client_reader, server_writer, inspect=True))
        to_client = asyncio.ensure_future(self._forward(server_reader, client_writer, inspect=False))
        self._pipes.update((to_server, to_client))
        try:
            await asyncio.wait({to_server, to_client}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in (to_server, to_client):
                pipe.cancel()
                self._pipes.discard(pipe)
            for writer in (server_writer, client_writer):
                writer.close()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, inspect: bool) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                header = await reader.readexactly(16)
                (length,) = struct.unpack_from("<i", header)
                message = header + await reader.readexactly(length - 16)
                if inspect and self._armed is not None and _command(message) in _writes(self._armed):
                    self._armed = None
                    self.held.set()
                    await self.go.wait()
                writer.write(message)
                await writer.drain()


class WirePause:
    """:class:`Pause` on the wire: the late write runs as a task until the gate holds
    its first write of ``collection``."""

    def __init__(self, gate: WireGate, collection: str) -> None:
        self._gate, self._collection = gate, collection
        self._task: asyncio.Task[Any] | None = None

    async def hold(self, write: Callable[[], Awaitable[Any]]) -> None:
        self._gate.arm(self._collection)
        self._task = task = asyncio.ensure_future(write())
        held = asyncio.ensure_future(self._gate.held.wait())
        await asyncio.wait({task, held}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if not held.done():
            held.cancel()
            if task.done():
                task.result()  # its error, if it failed
            task.cancel()
            raise AssertionError(f"the late write was not held at a write of {self._collection}")

    async def release(self) -> Any:
        assert self._task is not None
        self._gate.go.set()
        return await asyncio.wait_for(self._task, 60)


def _writes(collection: str) -> tuple[tuple[str, str], ...]:
    return (("insert", collection), ("update", collection))


def _command(message: bytes) -> tuple[str, str] | None:
    """``(command name, its collection)`` of an ``OP_MSG``, from its body section."""
    (op_code,) = struct.unpack_from("<i", message, 12)
    if op_code != OP_MSG:
        return None
    offset = 20  # header, flag bits
    while offset < len(message):
        kind = message[offset]
        offset += 1
        (size,) = struct.unpack_from("<i", message, offset)
        if kind == 0:
            body = bson.decode(message[offset : offset + size])
            name = next(iter(body), "")
            target = body.get(name)
            return name, target if isinstance(target, str) else ""
        offset += size
    return None


class LateWriter:
    """The stale writer of one storage: its own store instances (the test's own
    instance where the backend cannot share storage between instances), and
    :meth:`pause`, which holds its next deep-body or state write after its read."""

    def __init__(
        self, url: str, gate: WireGate | None, deep: DeepStore | None = None, steps: StepStore | None = None
    ) -> None:
        self._url = gate.url if gate is not None else url
        self._gate = gate
        self._shared_deep, self._shared_steps = deep, steps
        self._opened: list[DeepStore | StepStore] = []

    async def deep(self) -> DeepStore:
        if self._shared_deep is not None:
            return self._shared_deep
        store = await open_deep_store(self._url)
        self._opened.append(store)
        return store

    async def steps(self) -> StepStore:
        if self._shared_steps is not None:
            return self._shared_steps
        store = await open_step_store(self._url)
        self._opened.append(store)
        return store

    def pause(self, table: str) -> Pause:
        """Hold this writer's next write of ``table`` (``run_step_details``,
        ``run_state``): on the wire, its first ``insert`` or ``update`` of that
        collection; a backend whose write is one atomic step has nothing to hold
        and runs it whole when released."""
        if self._gate is None:
            return AtomicWrite()
        return self._gate.pause(table)

    async def close(self) -> None:
        for store in self._opened:
            await store.close()
        if self._gate is not None:
            await self._gate.close()
