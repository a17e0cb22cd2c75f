"""The key rule (CONTRACT.md section 2): which names hold secrets.

A key is split into segments on ``_``, ``-``, ``.``, whitespace and camelCase
boundaries (``APIKey`` -> ``API`` ``Key``; anything that is not an ASCII letter or
digit separates). It is *sensitive* when a segment, case-insensitively,

* is or ends with one of :data:`SENSITIVE_WORDS` or their plural
  (``x_auth_tokens``, ``myapikey``), or
* is exactly one of :data:`EXACT_SEGMENTS` (``X-Auth``, ``pwd``, ``db_pass``; as
  suffixes these would catch ``oauth``-like words and ``bypass``, ``compass``), or
* forms with the next segment one of :data:`SENSITIVE_PHRASES` (``api_key``,
  ``privateKey``, ``aws-access-key-id``; the first segment may end with the
  phrase's first word, the phrase may be written as one word).

**Counts are not secrets.** A key whose last segment is ``token`` or ``tokens``
right after one of :data:`COUNT_WORDS` (``max_tokens``, ``usage.input_tokens``,
``maxNewTokens``), and whose other segments are not sensitive, is a *count key*:
its value stays visible when it is an integer. Every other value under it (a
string, an object) is masked like under any sensitive key.

The same rule decides ``NAME=value``, ``NAME: value`` and ``--name value`` inside
strings (``core.credentials``).
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = [
    "COUNT_WORDS",
    "EXACT_SEGMENTS",
    "SENSITIVE_PHRASES",
    "SENSITIVE_WORDS",
    "is_count_key",
    "is_sensitive_key",
    "key_segments",
    "suffix_words",
]

SENSITIVE_WORDS = (
    "secret", "token", "password", "passwd", "apikey", "authorization", "bearer",
    "credential", "session", "cookie", "signature", "privatekey",
)  # fmt: skip
EXACT_SEGMENTS = ("auth", "pwd", "pass")
SENSITIVE_PHRASES = (
    ("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"),
    ("signing", "key"), ("encryption", "key"), ("auth", "key"), ("pass", "phrase"),
    ("client", "secret"), ("access", "token"), ("auth", "token"), ("refresh", "token"),
    ("id", "token"), ("session", "id"),
)  # fmt: skip
COUNT_WORDS = ("max", "min", "input", "output", "prompt", "completion", "total", "reasoning", "cached", "new")


def suffix_words() -> list[str]:
    """What a sensitive segment may end with: each word, each phrase as one word."""
    return sorted({w for w in SENSITIVE_WORDS} | {a + b for a, b in SENSITIVE_PHRASES})


_SUFFIXES = tuple({w for w in suffix_words()} | {w + "s" for w in suffix_words()})
_EXACT = frozenset(EXACT_SEGMENTS) | {w + "s" for w in EXACT_SEGMENTS if w != "pass"}
_PHRASE_FIRST = tuple({a for a, _ in SENSITIVE_PHRASES})
_PHRASE_PAIRS = {(a, b) for a, b in SENSITIVE_PHRASES} | {(a, b + "s") for a, b in SENSITIVE_PHRASES}
_COUNT_WORDS = frozenset(COUNT_WORDS)

_SEGMENT = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def key_segments(key: str) -> list[str]:
    """The lower-cased segments a key is judged by."""
    return [s.lower() for s in _SEGMENT.findall(key)]


def _sensitive(segments: list[str]) -> bool:
    previous = ""
    for segment in segments:
        if segment.endswith(_SUFFIXES) or segment in _EXACT:
            return True
        if previous and previous.endswith(_PHRASE_FIRST):
            for first, second in _PHRASE_PAIRS:
                if segment == second and previous.endswith(first):
                    return True
        previous = segment
    return False


@lru_cache(maxsize=8192)
def is_sensitive_key(key: str) -> bool:
    """Whether the value under ``key`` is masked (a count key holding an integer
    is the one exception, see :func:`is_count_key`)."""
    return _sensitive(key_segments(key))


@lru_cache(maxsize=4096)
def is_count_key(key: str) -> bool:
    """Whether ``key`` names a token count (``max_tokens``): its integer value stays visible."""
    segments = key_segments(key)
    return (
        len(segments) >= 2
        and segments[-1] in ("token", "tokens")
        and segments[-2] in _COUNT_WORDS
        and not _sensitive(segments[:-1])
    )
