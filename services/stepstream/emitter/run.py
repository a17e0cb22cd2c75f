"""One agent run of the producer SDK: one call per event type, the envelope each call
builds (``event_id``, the run's ``seq``, ``ts``), and the run's end when its
``with``/``async with`` block is left (see :mod:`stepstream.emitter.tracer` for the
sending side and its guarantees)."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

import msgspec

from stepstream.core.timefmt import format_ts

__all__ = ["Run", "Sender", "failure_of"]

_COMPANY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_FAILURE_MESSAGE_CHARS = 4000
_encoder = msgspec.json.Encoder()


def failure_of(exc: BaseException) -> dict[str, str]:
    """The failure object of a run ended by ``exc``: ``{type, message}``."""
    message = str(exc) or type(exc).__name__
    return {"type": type(exc).__name__, "message": message[:_FAILURE_MESSAGE_CHARS]}


class Sender(Protocol):
    """What a run needs of its tracer: its clock and its queue (``Tracer`` is one)."""

    _clock: Callable[[], datetime]

    def enqueue(self, key: bytes, value: bytes) -> bool: ...


class Run:
    """One agent run: each method sends one event and returns its ``event_id``
    (usable as another event's ``parent_id``). Thread-safe."""

    def __init__(
        self,
        tracer: Sender,
        company_id: str,
        run_id: str,
        *,
        agent_name: str,
        environment: Any = None,
        metadata: dict[str, Any] | None = None,
        parent_id: str | None = None,
    ) -> None:
        if not _COMPANY_ID.fullmatch(company_id):
            raise ValueError("company_id must match [A-Za-z0-9._-]{1,64}")
        if not _RUN_ID.fullmatch(run_id):
            raise ValueError("run_id must match [A-Za-z0-9._:-]{1,128}")
        self.tracer = tracer
        self.company_id = company_id
        self.run_id = run_id
        self.key = f"{company_id}/{run_id}".encode()
        self._start_payload: dict[str, Any] = {"agent_name": agent_name}
        if environment is not None:
            self._start_payload["environment"] = environment
        if metadata is not None:
            self._start_payload["metadata"] = metadata
        self._start_parent = parent_id
        self._lock = threading.Lock()
        self._next_seq = 0
        self.started = False
        self.ended = False

    def _emit(self, event_type: str, payload: dict[str, Any], parent_id: str | None) -> str:
        body = msgspec.Raw(_encoder.encode(payload))  # a bad payload raises here, before a seq is used
        event_id = str(uuid.uuid4())
        with self._lock:
            if self.ended:
                raise RuntimeError(f"run {self.run_id} has ended; no event can follow run_end")
            if event_type != "run_start" and not self.started:
                raise RuntimeError(f"run {self.run_id} has not started: enter it (with/async with) or call start()")
            envelope = {
                "v": 1,
                "event_id": event_id,
                "company_id": self.company_id,
                "run_id": self.run_id,
                "seq": self._next_seq,
                "ts": format_ts(self.tracer._clock()),
                "type": event_type,
                "parent_id": parent_id,
                "payload": body,
            }
            if parent_id is None:
                del envelope["parent_id"]
            self._next_seq += 1
            if event_type == "run_start":
                self.started = True
            elif event_type == "run_end":
                self.ended = True
            self.tracer.enqueue(self.key, _encoder.encode(envelope))
        return event_id

    # -- one call per event type --------------------------------------------------------

    def start(self) -> str:
        """Send ``run_start`` (once; entering the run's block does it)."""
        if self.started:
            raise RuntimeError(f"run {self.run_id} has already started")
        return self._emit("run_start", self._start_payload, self._start_parent)

    def llm_request(
        self, call_id: str, *, provider: str, model: str, input: Any, params: dict[str, Any] | None = None,
        parent_id: str | None = None,
    ) -> str:  # fmt: skip
        payload = {"call_id": call_id, "provider": provider, "model": model, "input": input}
        if params is not None:
            payload["params"] = params
        return self._emit("llm_request", payload, parent_id)

    def llm_response(
        self, call_id: str, output: Any, *, usage: dict[str, int] | None = None, stop_reason: str | None = None,
        parent_id: str | None = None,
    ) -> str:  # fmt: skip
        """``usage``: ``{input_tokens, output_tokens, reasoning_tokens, cache_read_input_tokens, cache_creation_input_tokens}`` (any of them)."""
        payload: dict[str, Any] = {"call_id": call_id, "output": output}
        if usage is not None:
            payload["usage"] = usage
        if stop_reason is not None:
            payload["stop_reason"] = stop_reason
        return self._emit("llm_response", payload, parent_id)

    def thinking(self, text: str, *, parent_id: str | None = None) -> str:
        """One ``thinking_delta``: send reasoning as it streams; the worker folds a run
        of consecutive deltas into one step."""
        return self._emit("thinking_delta", {"text": text}, parent_id)

    def tool_call(self, call_id: str, tool: str, arguments: dict[str, Any], *, parent_id: str | None = None) -> str:
        return self._emit("tool_call", {"call_id": call_id, "tool": tool, "arguments": arguments}, parent_id)

    def tool_result(self, call_id: str, output: Any, *, is_error: bool = False, parent_id: str | None = None) -> str:
        payload: dict[str, Any] = {"call_id": call_id, "output": output}
        if is_error:
            payload["is_error"] = True
        return self._emit("tool_result", payload, parent_id)

    def state_change(self, key: str, value: Any, *, parent_id: str | None = None) -> str:
        return self._emit("state_change", {"key": key, "value": value}, parent_id)

    def error(self, message: str, *, kind: str | None = None, parent_id: str | None = None) -> str:
        payload = {"message": message}
        if kind is not None:
            payload["kind"] = kind
        return self._emit("error", payload, parent_id)

    def end(self, status: str = "completed", failure: str | dict[str, Any] | None = None) -> str:
        """Send ``run_end``. ``failed`` needs a failure: an object ``{type, message,
        step?}`` or a string (the message)."""
        if status not in ("completed", "failed"):
            raise ValueError("status must be 'completed' or 'failed'")
        payload: dict[str, Any] = {"status": status}
        if status == "failed":
            if failure is None:
                raise ValueError("a failed run needs a failure (an object {type, message} or a string)")
            payload["failure"] = failure
        return self._emit("run_end", payload, None)

    # -- context managers ------------------------------------------------------------------

    def __enter__(self) -> Run:
        if not self.started:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self.ended:
            return
        if exc is None:
            self.end("completed")
        else:
            self.end("failed", failure_of(exc))

    async def __aenter__(self) -> Run:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self.__exit__(exc_type, exc, tb)
