"""The producer side: the SDK agents use (:class:`Tracer` in ``tracer``, :class:`Run`
in ``run``; import both from here), the low-level pipelined producer the tests and
benchmarks use (``producer``), the realistic corpus the demo, tests and benchmarks
share (``corpus``) and the ``stepstream demo`` command (``demo``). Importing this
package imports nothing else: the SDK names load on first use, so using the pure
corpus never pulls in a Kafka client."""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["Run", "Tracer", "TracerStats", "failure_of"]

_HOME = {"Run": "run", "failure_of": "run", "Tracer": "tracer", "TracerStats": "tracer"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(import_module(f"stepstream.emitter.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
