"""The engine's numbers: caps, the step ceiling, flush thresholds, the late-event window.

One frozen :class:`Limits` that ``caps``, ``steps``, ``fold`` and the sinks read, so none
of them imports the state machine for a number (``core.fold`` re-exports it).
"""

from __future__ import annotations

import msgspec

__all__ = ["Limits"]


class Limits(msgspec.Struct, frozen=True):
    """Caps (characters of what a reader sees: a string by its characters, any other
    value by its compact JSON text), the step ceiling, the flush thresholds (UTF-8
    bytes and deltas pending), the idle timeout (seconds of the injected clock), how
    far past the last applied ``seq`` an event may jump, and how many skipped ``seq``
    ranges a run remembers so that late events can fill them (``late_ranges``; the
    same bound holds the results that wait for a late call). ``environment_bytes``
    caps the run_start's environment on the run record in UTF-8 bytes of its compact
    JSON text (``core.caps.json_body_bytes``): it is written once, with its run_start,
    and is in no fold state, so it is bounded like any field an operator sees."""

    reasoning_chars: int = 65536
    output_chars: int = 65536
    arguments_chars: int = 32768
    max_steps: int = 500
    flush_bytes: int = 2048
    idle_seconds: float = 5.0
    flush_deltas: int = 512
    max_seq_jump: int = 1_000_000
    late_ranges: int = 64
    environment_bytes: int = 32768
    # How many unsequenced event ids (OpenTelemetry spans' events) a run remembers to
    # skip their redeliveries (core.fold.RunFold.push): 500 steps of about two events.
    applied_ids: int = 1024
