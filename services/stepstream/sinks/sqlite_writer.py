"""The SQLite sink's writer connection, in a child process of its own.

A batch write is mostly Python work around SQLite: turning records into parameter
rows, binding them, and SQLite's own B-tree work between. In the worker's process
that work competes for the GIL with the folding of the next batch; in a thread it
also hands the GIL back and forth at every row (``sqlite3`` releases it around each
step), so both slow down. Here the writer connection lives in
``python -m stepstream.sinks.sqlite_writer``: the worker sends each transaction as
one message (the records, msgspec MessagePack, which costs a fraction of building
the rows) and waits for one reply, on a thread, while it goes on folding.

Protocol, over the child's stdin and stdout: every message is an 8-byte big-endian
length and a body. A request body is one format byte (``m``: MessagePack decoded
into the operation's argument types; ``p``: pickle, for the rare batch MessagePack
cannot hold, such as an integer beyond 64 bits or a lone surrogate that SQLite is
then to refuse), one byte of operation-name length, the name, then the arguments.
A reply is the pickle of ``("ok", result)`` or ``("error", retriable, message)``.
The first reply, sent after the child opened the file and made the schema, carries
the connection's durability setting.

Lifetime: the child ignores SIGINT and SIGTERM (a shutdown must still be able to
write its last batch) and exits when its stdin closes: when the store closes, or
when the worker dies in any way, after the transaction in hand ends (commits or
rolls back). A write that lands after its worker died is the case of a zombie
writer, which every store write already survives (``docs/worker.md``).

What happens inside one operation (``BEGIN IMMEDIATE`` ... ``COMMIT``, the error
classes) is ``stepstream.sinks.sqlite_operations``'s; this module is only the
transport. ``sinks.sqlite`` imports it, it imports the operations, and neither of
those imports ``sinks.sqlite``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
from typing import IO, TYPE_CHECKING, Any

import msgspec

from stepstream import collector
from stepstream.errors import SinkError, SinkUnavailable
from stepstream.sinks.sqlite_operations import OPERATIONS, open_writer

if TYPE_CHECKING:
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

# The client side (WriterProcess) imports asyncio, subprocess and concurrent.futures where
# it uses them: the child, which runs this module, needs none of them, and they were a
# third of its start-up.

_HEADER = 8
_CLOSE_SECONDS = 10.0
_encoder = msgspec.msgpack.Encoder()


def _frame(body: bytes) -> bytes:
    return len(body).to_bytes(_HEADER, "big") + body


def _read_frame(stream: IO[bytes]) -> bytes | None:
    header = stream.read(_HEADER)
    if len(header) < _HEADER:
        return None
    size = int.from_bytes(header, "big")
    body = stream.read(size)
    if len(body) < size:
        return None
    return body


def request(op: str, args: tuple[Any, ...]) -> bytearray:
    """The whole frame (length header included) of a request for ``op``: MessagePack
    when it can hold ``args``, else pickle. Encoded in place into one buffer: a batch's
    request is as large as its bodies, and a copy per layer (body, then frame) would
    double the worker's peak memory for each write."""
    name = op.encode()
    start = _HEADER + 2 + len(name)
    frame = bytearray(_HEADER) + b"m" + bytes((len(name),)) + name
    try:
        _encoder.encode_into(args, frame, start)
    except (OverflowError, UnicodeEncodeError, TypeError, ValueError):
        del frame[start:]
        frame[_HEADER] = ord("p")
        frame += pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
    frame[:_HEADER] = (len(frame) - _HEADER).to_bytes(_HEADER, "big")
    return frame


class WriterProcess:
    """The client side: starts the child, sends it one operation at a time."""

    def __init__(self, path: str, synchronous: str, busy_timeout_ms: int, schema: str) -> None:
        self._argv = [sys.executable, "-m", "stepstream.sinks.sqlite_writer", path, synchronous,
                      str(busy_timeout_ms), schema]  # fmt: skip
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: ThreadPoolExecutor | None = None
        self.durability = ""

    @property
    def pid(self) -> int | None:
        """The child's process id, while it runs."""
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        """Start the child; it opens the file and makes the schema (a failure there is
        raised here, as the :class:`SinkError` the child reports)."""
        import subprocess
        from concurrent.futures import ThreadPoolExecutor

        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stepstream-sqlite-writer")
        self._proc = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            self.durability = await self._on_thread(self._read_reply)
        except BaseException:
            await self.close()
            raise

    async def call(self, op: str, *args: Any) -> Any:
        """Run ``op`` in the child; its result, or the :class:`SinkError` it raised.
        Callers serialise calls (a lock); one cancelled while waiting leaves the
        exchange to finish on the thread, so replies never go to the wrong call."""
        frame = request(op, args)
        return await self._on_thread(self._exchange, frame)

    async def _on_thread(self, fn: Any, *args: Any) -> Any:
        if self._thread is None:
            raise SinkError("sqlite sink: store is closed")
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _exchange(self, frame: bytearray) -> Any:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise SinkError("sqlite sink: store is closed")
        try:
            proc.stdin.write(frame)
            proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            raise self._gone() from None
        return self._read_reply()

    def _read_reply(self) -> Any:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        frame = _read_frame(proc.stdout)
        if frame is None:
            raise self._gone()
        reply = pickle.loads(frame)
        if reply[0] == "ok":
            return reply[1]
        _, retriable, message = reply
        raise (SinkUnavailable if retriable else SinkError)(message) from None

    def _gone(self) -> SinkError:
        import subprocess

        proc = self._proc
        status = None
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                status = proc.wait(1.0)
        return SinkError(f"sqlite sink: the writer process exited (status {status})")

    async def close(self) -> None:
        """Close the child's stdin (after any exchange still on the thread) and wait for
        it to exit; killed after :data:`_CLOSE_SECONDS`."""
        import asyncio
        import subprocess

        thread, self._thread = self._thread, None
        proc, self._proc = self._proc, None
        if proc is None:
            if thread is not None:
                thread.shutdown(wait=False)
            return

        def finish() -> None:
            with contextlib.suppress(OSError, ValueError):
                if proc.stdin is not None:
                    proc.stdin.close()
            try:
                proc.wait(_CLOSE_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

        try:
            if thread is not None:
                await asyncio.wait_for(
                    asyncio.get_running_loop().run_in_executor(thread, finish), timeout=_CLOSE_SECONDS + 5
                )
            else:
                finish()
        except asyncio.TimeoutError:  # the thread is stuck in an exchange with a hung child
            proc.kill()
        finally:
            if thread is not None:
                thread.shutdown(wait=False)


def serve(path: str, synchronous: str, busy_timeout_ms: int, schema: str) -> int:
    """The child's loop (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # nothing else may write to the reply stream

    def reply(value: Any) -> None:
        replies.write(_frame(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)))
        replies.flush()

    try:
        conn, durability = open_writer(path, synchronous, busy_timeout_ms, schema)
    except SinkError as exc:
        reply(("error", exc.retriable, str(exc)))
        return 1
    reply(("ok", durability))
    collector.tune()
    decoders: dict[str, msgspec.msgpack.Decoder[Any]] = {}
    try:
        while True:
            body = _read_frame(requests)
            if body is None:
                return 0
            fmt, size = body[:1], body[1]
            op = body[2 : 2 + size].decode()
            data = memoryview(body)[2 + size :]  # not a copy of the whole batch
            try:
                fn, types = OPERATIONS[op]
                if fmt == b"m":
                    decoder = decoders.get(op)
                    if decoder is None:
                        decoder = decoders[op] = msgspec.msgpack.Decoder(tuple.__class_getitem__(types))
                    args = decoder.decode(data)
                else:
                    args = pickle.loads(data)
                data.release()
                body = None  # the request's bytes go before the transaction builds its rows
                reply(("ok", fn(conn, *args)))
            except SinkError as exc:
                reply(("error", exc.retriable, str(exc)))
            except Exception as exc:  # noqa: BLE001 - reported to the store, which names it
                reply(("error", False, f"sqlite sink: the writer failed: {type(exc).__name__}"))
            args = None  # nor are its rows kept while the next request is read
    finally:
        with contextlib.suppress(Exception):
            conn.close()


if __name__ == "__main__":
    _path, _sync, _busy, _schema = sys.argv[1:5]
    sys.exit(serve(_path, _sync, int(_busy), _schema))
