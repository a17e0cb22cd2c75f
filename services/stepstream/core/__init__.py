"""The pure core: wire events, the step engine and what it makes.

Data flows one way: bytes -> :func:`decode_event` -> :class:`RunFold` ->
(:class:`StepRecord`, :class:`DeepRecord`, :class:`RunRecord`, :class:`RunState`).
No module here does I/O, reads the environment or the clock, or imports an
event loop or a driver (``tests/unit/test_core_purity.py`` holds it to that).

* ``wire``: the v1 event union and its decoder.
* ``records``: the stored record types and their write semantics; ``merge``
  applies them.
* ``fold``: the per-run state machine (:class:`RunFold`, :class:`Output`); ``limits``: its numbers (:class:`Limits`).
* ``steps``: what each event's step and deep companion hold.
* ``redact``, ``caps``, ``shapes``, ``timefmt``: scrubbing, clipping, shapes, stored times;
  ``keyrule`` and ``credentials`` are redaction's two lines (``docs/redaction.md``).
"""

from typing import TYPE_CHECKING

from stepstream.lazy import exports

if TYPE_CHECKING:
    from stepstream.core.caps import CLIP_MARKER, clip, clip_deep
    from stepstream.core.fold import Output, RunFold
    from stepstream.core.limits import Limits
    from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
    from stepstream.core.redact import REDACTED, is_sensitive_key, mask_credentials, scrub
    from stepstream.core.shapes import shape
    from stepstream.core.timefmt import format_ts, parse_ts
    from stepstream.core.wire import Event, decode_event, encode_event

# Each name's module is imported when the name is first read (stepstream.lazy): a process
# that needs one module (a SQLite writer needs the records and caps) does not import the
# fold, the redactor and the decoder too. (The redactor is ``stepstream.core.redact.redact``:
# ``stepstream.core.redact`` is its module.)
__getattr__, __dir__ = exports(
    globals(),
    {
        "CLIP_MARKER": "caps", "clip": "caps", "clip_deep": "caps",
        "Output": "fold", "RunFold": "fold",
        "Limits": "limits",
        "DeepRecord": "records", "RunRecord": "records", "RunState": "records", "StepRecord": "records",
        "REDACTED": "redact", "is_sensitive_key": "redact", "mask_credentials": "redact", "scrub": "redact",
        "shape": "shapes",
        "format_ts": "timefmt", "parse_ts": "timefmt",
        "Event": "wire", "decode_event": "wire", "encode_event": "wire",
    },
)  # fmt: skip

__all__ = [
    "CLIP_MARKER",
    "REDACTED",
    "DeepRecord",
    "Event",
    "Limits",
    "Output",
    "RunFold",
    "RunRecord",
    "RunState",
    "StepRecord",
    "clip",
    "clip_deep",
    "decode_event",
    "encode_event",
    "format_ts",
    "is_sensitive_key",
    "mask_credentials",
    "parse_ts",
    "scrub",
    "shape",
]
