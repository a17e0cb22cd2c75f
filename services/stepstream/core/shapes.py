"""Output shapes: what a step says about a value instead of showing it.

A step never carries raw output (CONTRACT.md section 2); it carries a shape that
reads like ``12 items``, ``1 field``, ``140 characters``, ``4.2k characters``,
``1.2M characters``, ``number``, ``boolean`` or ``null``. Large counts are
rounded *down* to one decimal (``65536`` -> ``65.5k``), so a shape never
overstates, and a trailing ``.0`` is dropped (``1000`` -> ``1k``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["shape", "shape_chars"]


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _compact(n: int) -> str:
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        tenths, unit = n // 100, "k"
    else:
        tenths, unit = n // 100_000, "M"
    whole, frac = divmod(tenths, 10)
    return f"{whole}{unit}" if frac == 0 else f"{whole}.{frac}{unit}"


def shape_chars(n: int) -> str:
    """The shape of a text of ``n`` characters."""
    if n == 1:
        return "1 character"
    return f"{_compact(n)} characters"


def shape(value: Any) -> str:
    """The shape of any JSON value (and of the Python types msgspec decodes it to)."""
    if isinstance(value, str):
        return shape_chars(len(value))
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return _plural(len(value), "field", "fields")
    if isinstance(value, (list, tuple)):
        return _plural(len(value), "item", "items")
    if isinstance(value, (bytes, bytearray)):
        return _plural(len(value), "byte", "bytes")
    return type(value).__name__
