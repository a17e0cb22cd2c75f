"""Redaction for everything an operator (or a bundle, or a log) can see.

Two lines of defence, both applied by :func:`redact`:

1. **By key name** (``core.keyrule``, CONTRACT.md section 2): the value under a
   sensitive key becomes :data:`REDACTED` and nothing below it is walked, except
   an integer under a token *count* key (``max_tokens``, ``usage.input_tokens``),
   which stays visible.
2. **By credential format** (``core.credentials``): every string, and every key,
   is scanned for credentials (URL passwords, ``Basic``/``Bearer``/``Digest``/
   ``Token`` credentials, JWTs, cloud, SaaS and registry tokens, private keys,
   ``NAME=value`` with a sensitive NAME, ...). Only the credential is replaced
   (``postgres://admin:[redacted]@db:5432/prod``); the rest of the text stays.
   A key that is itself a credential is shown masked (``{"Bearer [redacted]": 1}``).

The walk is fail-closed: a container deeper than ``max_depth`` or one whose
entries would take the walk past ``max_nodes`` becomes :data:`REDACTED` whole.

:func:`redact` also returns, for a bundle's ``redactions.json``, the JSON Pointer
(RFC 6901) of every value it replaced or masked and the rule that did it, never
the secret: a pointer names a masked key by its masked form.

:func:`scrub` is the one function for free text an operator or a log sees outside
arguments (labels, state keys, error kinds and messages, the run's agent name,
environment and failure, dead-letter details): credentials masked, then clipped to
a length cap. It takes structured values too (an environment object, a failure
``{type, message, step?}``): they are redacted like arguments, every string and
key clipped.

What it does not promise (``docs/redaction.md``): a secret under an unlisted key,
in a shape none of the rules knows (free prose such as "the password is hunter2"),
stays visible. Raw output never reaches a step at all.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

from stepstream.core.caps import clip
from stepstream.core.credentials import mask_text
from stepstream.core.keyrule import (
    SENSITIVE_PHRASES,
    SENSITIVE_WORDS,
    is_count_key,
    is_sensitive_key,
    key_segments,
)

__all__ = [
    "LABEL_CHARS",
    "MAX_DEPTH",
    "MAX_NODES",
    "REDACTED",
    "SENSITIVE_PHRASES",
    "SENSITIVE_WORDS",
    "Redaction",
    "TEXT_CHARS",
    "is_count_key",
    "is_sensitive_key",
    "key_segments",
    "mask_credentials",
    "redact",
    "scrub",
]

REDACTED = "[redacted]"
MAX_DEPTH = 32
MAX_NODES = 5000

LABEL_CHARS = 256  # labels, state keys, error kinds, agent names, environments
TEXT_CHARS = 2048  # error messages and failures on steps and run records, dead-letter details
_KEY_CACHE_CHARS = 256  # keys repeat: masked keys up to this length are cached

RULE_KEY = "key_name"
RULE_BUDGET = "budget"


class Redaction(NamedTuple):
    value: Any
    pointers: list[str]
    rules: list[str]  # rules[i] masked pointers[i]: "key_name", "budget" or credential rules joined by "+"


@lru_cache(maxsize=8192)
def _mask_key(key: str) -> tuple[str, tuple[str, ...]]:
    return mask_text(key, REDACTED)


def mask_credentials(text: str) -> str:
    """``text`` with every credential inside it replaced (the second line alone)."""
    return mask_text(text, REDACTED)[0]


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


class _Walk:
    __slots__ = ("budget", "max_chars", "max_depth", "mask_values", "path", "pointers", "rules")

    def __init__(self, max_depth: int, max_nodes: int, mask_values: bool, max_chars: int | None) -> None:
        self.budget = max_nodes
        self.max_depth = max_depth
        self.mask_values = mask_values
        self.max_chars = max_chars
        self.path: list[str] = []
        self.pointers: list[str] = []
        self.rules: list[str] = []

    def hit(self, rule: str, token: str | None = None) -> str:
        parts = self.path if token is None else [*self.path, token]
        self.pointers.append("".join("/" + _escape(p) for p in parts))
        self.rules.append(rule)
        return REDACTED

    def text(self, value: str) -> str:
        if self.mask_values:
            masked, rules = mask_text(value, REDACTED)
            if rules:
                self.hit("+".join(rules))
            value = masked
        if self.max_chars is not None:
            value = clip(value, self.max_chars)[0]
        return value

    def key(self, key: str, taken: dict) -> str:
        """How ``key`` is shown: masked and clipped like a string, two keys masked
        alike kept apart (``[redacted]``, ``[redacted]#2``)."""
        shown, rules = key, ()
        if self.mask_values:
            shown, rules = _mask_key(key) if len(key) <= _KEY_CACHE_CHARS else mask_text(key, REDACTED)
        if self.max_chars is not None:
            shown = clip(shown, self.max_chars)[0]
        if shown != key:
            base, n = shown, 2
            while shown in taken:
                shown, n = f"{base}#{n}", n + 1
            if rules:
                self.hit("+".join(rules), shown)
        return shown

    def value(self, value: Any, depth: int) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            if depth >= self.max_depth or len(value) > self.budget:
                return self.hit(RULE_BUDGET)
            self.budget -= len(value)
            out: dict = {}
            path = self.path
            for key, item in value.items():
                skey = key if isinstance(key, str) else str(key)
                shown = self.key(skey, out)
                name = key if shown == skey else shown
                if is_sensitive_key(skey) and not (type(item) is int and is_count_key(skey)):
                    out[name] = self.hit(RULE_KEY, shown)
                else:
                    path.append(shown)
                    out[name] = self.value(item, depth + 1)
                    path.pop()
            return out
        if isinstance(value, (list, tuple)):
            if depth >= self.max_depth or len(value) > self.budget:
                return self.hit(RULE_BUDGET)
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
    value: Any,
    *,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
    mask_values: bool = True,
    max_chars: int | None = None,
) -> Redaction:
    """A redacted copy of ``value`` (the input is never changed), the JSON Pointers
    of what was replaced, in walk order, and the rule of each. ``max_depth`` counts
    container levels from the root (the root container is at depth 0);
    ``max_nodes`` bounds the entries walked in total; ``max_chars`` clips every
    string and key (after masking). ``mask_values=False`` turns the second line off."""
    walk = _Walk(max_depth, max_nodes, mask_values, max_chars)
    return Redaction(walk.value(value, 0), walk.pointers, walk.rules)


@lru_cache(maxsize=4096)
def _scrub_short(text: str, max_chars: int) -> str:
    return clip(mask_text(text, REDACTED)[0], max_chars)[0]


def scrub(value: Any, max_chars: int = LABEL_CHARS) -> Any:
    """``value`` as an operator or a log may see it: a string with its credentials
    masked, then clipped to ``max_chars`` characters (``core.caps.clip``: the head
    and a visible marker); a structured value redacted like arguments, each string
    and key clipped so; ``None`` and other scalars as they are. Idempotent."""
    if isinstance(value, str):
        if len(value) <= _KEY_CACHE_CHARS:  # labels and call ids repeat
            return _scrub_short(value, max_chars)
        return clip(mask_text(value, REDACTED)[0], max_chars)[0]
    if isinstance(value, (dict, list, tuple)):
        return redact(value, max_chars=max_chars).value
    return value
