"""The producer side: the SDK agents use (``sdk``: :class:`Tracer` and :class:`Run`,
also importable from this package), the low-level pipelined producer the tests and
benchmarks use (``producer``), the realistic corpus the demo, tests and benchmarks
share (``corpus``) and the ``stepstream demo`` command (``demo``). Importing this
package imports nothing else: the SDK names load on first use, so using the pure
corpus never pulls in a Kafka client."""

from __future__ import annotations

from typing import Any

__all__ = ["Run", "Tracer", "TracerStats"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from stepstream.emitter import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
