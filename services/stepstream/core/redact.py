"""Redaction for everything an operator (or a bundle) can see.

Two lines of defence, both applied by :func:`redact`:

1. **By key name** (CONTRACT.md section 2). A key is split into segments on
   ``_``, ``-``, ``.``, whitespace and camelCase boundaries (``APIKey`` ->
   ``API`` ``Key``; anything that is not an ASCII letter or digit separates).
   It is *sensitive* when a segment, case-insensitively, is or ends with one of
   :data:`SENSITIVE_WORDS` or their plural (``x_auth_tokens``, ``myapikey``), or
   two adjacent segments form one of :data:`SENSITIVE_PHRASES` (``api_key``,
   ``privateKey``, ``aws-access-key-id``; the first segment may end with the
   phrase's first word). The value under a sensitive key becomes
   :data:`REDACTED` and nothing below it is walked.
   Note this is literal and fail-closed: ``max_tokens`` is sensitive too.
2. **By value shape.** Strings under *any* key are scanned for things that look
   like credentials: ``sk-...`` API keys, GitHub tokens (``ghp_``, ``gho_``,
   ``ghu_``, ``ghs_``, ``ghr_``, ``github_pat_``), AWS access key ids, Slack
   tokens, ``Bearer <token>`` and PEM ``PRIVATE KEY`` blocks. Only the
   credential is replaced (``Bearer [redacted]``); the rest of the text stays.

The walk is fail-closed: a container deeper than ``max_depth`` or one whose
entries would take the walk past ``max_nodes`` becomes :data:`REDACTED` whole.

What it does not promise (deep-trace.md): a secret under an unlisted key, in a
shape none of the patterns knows, stays visible. Raw output never reaches a step
at all, so this only guards arguments, params, state values and error text.

:func:`redact` also returns the JSON Pointers (RFC 6901) of every value it
replaced or masked, never the secret itself, for a bundle's ``redactions.json``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, NamedTuple

__all__ = [
    "MAX_DEPTH",
    "MAX_NODES",
    "REDACTED",
    "SENSITIVE_PHRASES",
    "SENSITIVE_WORDS",
    "Redaction",
    "is_sensitive_key",
    "key_segments",
    "mask_credentials",
    "redact",
]

REDACTED = "[redacted]"
MAX_DEPTH = 32
MAX_NODES = 5000

SENSITIVE_WORDS = (
    "secret", "token", "password", "passwd", "apikey", "authorization", "bearer",
    "credential", "session", "cookie", "signature", "privatekey",
)  # fmt: skip
SENSITIVE_PHRASES = (
    ("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"),
    ("signing", "key"), ("encryption", "key"), ("auth", "key"), ("pass", "phrase"),
    ("client", "secret"), ("access", "token"), ("auth", "token"), ("refresh", "token"),
    ("id", "token"), ("session", "id"),
)  # fmt: skip

# A segment ending with a word, or with a phrase written as one word ("accesskey").
_SUFFIXES = tuple(
    {w for w in SENSITIVE_WORDS} | {w + "s" for w in SENSITIVE_WORDS}
    | {a + b for a, b in SENSITIVE_PHRASES} | {a + b + "s" for a, b in SENSITIVE_PHRASES}
)  # fmt: skip
_PHRASE_FIRST = tuple({a for a, _ in SENSITIVE_PHRASES})
_PHRASE_PAIRS = {(a, b) for a, b in SENSITIVE_PHRASES} | {(a, b + "s") for a, b in SENSITIVE_PHRASES}

_SEGMENT = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")

_CREDENTIAL = re.compile(
    r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY-----(?:.*?-----END[A-Z0-9 ]{0,40}PRIVATE KEY-----|.*)"
    r"|(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{16,}"
    r"|(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9_]{20,}"
    r"|(?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{20,}"
    r"|(?<![A-Za-z0-9])AKIA[0-9A-Z]{16}(?![0-9A-Z])"
    r"|(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|(?P<scheme>\b[Bb][Ee][Aa][Rr][Ee][Rr])[ \t]+[A-Za-z0-9._~+/-]{8,}=*",
    re.DOTALL,
)
_MIN_CREDENTIAL = 12  # shorter strings cannot hold any of the patterns


class Redaction(NamedTuple):
    value: Any
    pointers: list[str]


def key_segments(key: str) -> list[str]:
    """The lower-cased segments a key is judged by."""
    return [s.lower() for s in _SEGMENT.findall(key)]


@lru_cache(maxsize=8192)
def is_sensitive_key(key: str) -> bool:
    """Whether the value under ``key`` is masked (see the module docstring)."""
    segments = key_segments(key)
    previous = ""
    for segment in segments:
        if segment.endswith(_SUFFIXES):
            return True
        if previous and previous.endswith(_PHRASE_FIRST):
            for first, second in _PHRASE_PAIRS:
                if segment == second and previous.endswith(first):
                    return True
        previous = segment
    return False


def _mask_match(match: re.Match[str]) -> str:
    scheme = match.group("scheme")
    return f"{scheme} {REDACTED}" if scheme else REDACTED


def mask_credentials(text: str) -> str:
    """``text`` with every credential-shaped substring replaced."""
    if len(text) < _MIN_CREDENTIAL:
        return text
    return _CREDENTIAL.sub(_mask_match, text)


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


class _Walk:
    __slots__ = ("budget", "max_depth", "mask_values", "path", "pointers")

    def __init__(self, max_depth: int, max_nodes: int, mask_values: bool) -> None:
        self.budget = max_nodes
        self.max_depth = max_depth
        self.mask_values = mask_values
        self.path: list[str] = []
        self.pointers: list[str] = []

    def hit(self, token: str | None = None) -> str:
        parts = self.path if token is None else [*self.path, token]
        self.pointers.append("".join("/" + _escape(p) for p in parts))
        return REDACTED

    def value(self, value: Any, depth: int) -> Any:
        if isinstance(value, str):
            if self.mask_values and len(value) >= _MIN_CREDENTIAL:
                masked = _CREDENTIAL.sub(_mask_match, value)
                if masked != value:
                    self.hit()
                return masked
            return value
        if isinstance(value, dict):
            if depth >= self.max_depth or len(value) > self.budget:
                return self.hit()
            self.budget -= len(value)
            out = {}
            path = self.path
            for key, item in value.items():
                skey = key if isinstance(key, str) else str(key)
                if is_sensitive_key(skey):
                    out[key] = self.hit(skey)
                else:
                    path.append(skey)
                    out[key] = self.value(item, depth + 1)
                    path.pop()
            return out
        if isinstance(value, (list, tuple)):
            if depth >= self.max_depth or len(value) > self.budget:
                return self.hit()
            self.budget -= len(value)
            path = self.path
            out_list = []
            for index, item in enumerate(value):
                path.append(str(index))
                out_list.append(self.value(item, depth + 1))
                path.pop()
            return out_list
        return value


def redact(
    value: Any, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES, mask_values: bool = True
) -> Redaction:
    """A redacted copy of ``value`` (the input is never changed) and the JSON
    Pointers of what was replaced, in walk order. ``max_depth`` counts container
    levels from the root (the root container is at depth 0); ``max_nodes``
    bounds the entries walked in total."""
    walk = _Walk(max_depth, max_nodes, mask_values)
    return Redaction(walk.value(value, 0), walk.pointers)
