"""Canonical JSON (profile ``stepfork-json-v0.1``) and the payload hash of a bundle.

The ``.sftrace`` reference hashes payloads over Python's own ``json`` text with
sorted keys, compact separators (``,`` and ``:``), non-ASCII characters kept as
UTF-8 and non-finite floats refused. We use the same serializer rather than
msgspec: msgspec writes some floats differently (``1e16`` against Python's
``1e+16``), and a hash must be byte-equal to the reference's.

:func:`canonical_bytes` raises :class:`CanonicalError` (a ``ValueError``) for a
value that is not JSON: a non-string key, a non-finite float, another type.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

__all__ = ["PROFILE", "CanonicalError", "canonical_bytes", "payload_hash"]

PROFILE = "stepfork-json-v0.1"


class CanonicalError(ValueError):
    """A value outside JSON (non-string key, NaN or infinity, another type)."""


def _check(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if item is None or isinstance(item, (str, bool, int)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise CanonicalError("non-finite floats are not JSON")
            continue
        if isinstance(item, list):
            stack.extend(item)
            continue
        if isinstance(item, dict):
            for key, sub in item.items():
                if not isinstance(key, str):
                    raise CanonicalError("object keys must be strings")
                stack.append(sub)
            continue
        raise CanonicalError(f"not a JSON value: {type(item).__name__}")


def canonical_bytes(value: Any) -> bytes:
    """``value`` under the canonical profile, as UTF-8 bytes."""
    _check(value)
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate in a string
        raise CanonicalError(f"not encodable as UTF-8: {exc.reason}") from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise CanonicalError(str(exc)) from None


def payload_hash(value: Any) -> str:
    """SHA-256 (hex) of :func:`canonical_bytes`: an ``input_hash``/``output_hash``."""
    return hashlib.sha256(canonical_bytes(value)).hexdigest()
