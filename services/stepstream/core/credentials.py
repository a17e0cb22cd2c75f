"""The second line of redaction: credential formats found inside any string.

:func:`find_secrets` returns the spans of a string to mask, each with the name of
the rule that found it; ``core.redact`` replaces them with ``[redacted]`` and keeps
the rest of the sentence (``postgres://admin:[redacted]@db:5432/prod``).

**Linear time.** All rules are one RE2 program (``google-re2``): a DFA over the
text, linear in its length whatever the input, so a hostile string of near-matches
costs about one pass. Python's backtracking ``re`` was measured against it
(``docs/redaction.md``): with thirty-odd rules it must either try the alternation
at every position or scan once per rule, and both cost far more than a pass on
1 MiB of near-matches. RE2 has no look-around; boundaries are ``\\b`` or spelled
out, and every pattern here also compiles under Python ``re`` (a unit test says so).

**Prefilter.** A call into RE2 from Python costs a few microseconds, so a string
first goes through :func:`_maybe`: shorter than :data:`MIN_CHARS`, or (up to
:data:`PREFILTER_CHARS` characters) holding none of the rules' lower-case anchors,
it cannot match and is returned at once. Longer strings go straight to RE2, whose
one pass is cheaper than the anchor checks. A test holds every rule to its anchors.

**Verification.** Only two rules ask Python after the DFA: ``name_value`` (is the
name sensitive under the key rule of ``core.redact``, and is it a token *count*
holding an integer?) and ``basic_auth`` (does the credential decode to
``user:password``?). A candidate they refuse is not masked and the scan goes on
right after its name, so its value is still scanned by every rule.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import NamedTuple

import re2

from stepstream.core import keyrule

__all__ = ["MIN_CHARS", "PREFILTER_CHARS", "RULES", "Rule", "Span", "find_secrets", "mask_text", "might_hold_secret"]

MIN_CHARS = 5  # no rule matches fewer characters ("pwd=x")
PREFILTER_CHARS = 4096  # above this RE2's one pass beats the anchor checks


def ci(word: str) -> str:
    """``word`` matched ASCII-case-insensitively (RE2's ``(?i)`` folds Unicode too:
    it would match ``ſecret``, which no lower-cased anchor finds)."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in word)


def _alt(words: list[str]) -> str:
    return "(?:" + "|".join(sorted(words, key=len, reverse=True)) + ")"


class Rule(NamedTuple):
    name: str
    pattern: str  # RE2 (and Python re) syntax; groups named s, s2, ... are masked
    anchors: tuple[str, ...]  # lower-case; a match implies one of them in text.lower()
    verify: Callable[[str, str], bool] | None = None  # (name group, secret) -> mask it?
    exact_anchors: tuple[str, ...] = ()  # case-sensitive, in the text itself


class Span(NamedTuple):
    start: int
    end: int
    rule: str


# -- the key rule, as a DFA ------------------------------------------------------
# A name is sensitive when a segment is or ends with a word (core.redact). In a DFA:
# the word, case-insensitively, followed by something that is not a lower-case
# letter (a segment cannot continue there). Exact segments (auth, pwd, pass) need a
# segment start before them too. This is a superset; redact.is_sensitive_key decides.

_NAMECH = r"[A-Za-z0-9_.\-]"
_ENDING = _alt([ci(w) for w in keyrule.suffix_words()])
_PHRASE = "(?:" + "|".join(
    f"{ci(a)}[_.\\-]?{ci(b)}s?" for a, b in keyrule.SENSITIVE_PHRASES
) + ")"  # fmt: skip
_EXACT_LOWER = _alt([w for w in keyrule.EXACT_SEGMENTS])
_EXACT_CAP = _alt([w.capitalize() for w in keyrule.EXACT_SEGMENTS])
_EXACT_UPPER = _alt([w.upper() for w in keyrule.EXACT_SEGMENTS])
_AFTER = rf"(?:[A-Z0-9_.\-]{_NAMECH}*)?"  # the rest of the name, if any, starts a new segment
_NAME = (
    "(?:"
    rf"{_NAMECH}*(?:{_ENDING}|{_PHRASE})s?"
    rf"|(?:{_NAMECH}*[0-9_.\-])?(?:{_EXACT_LOWER}|{_EXACT_CAP}|{_EXACT_UPPER})s?"
    rf"|{_NAMECH}*[A-Za-z](?:{_EXACT_CAP})s?"
    rf"|{_NAMECH}*[a-z](?:{_EXACT_UPPER})S?"
    f"){_AFTER}"
)
_SCHEME = _alt([ci(w) for w in ("basic", "bearer", "token")])  # a Digest value is digest_auth's
_VALUE_CH = r"[^\s\"'`\\,;&<>(){}\[\]=]"
_VALUE = (
    rf"(?:\\*\"(?:{_SCHEME}[ \t]+)?(?P<s>[^\"\\\r\n]+)"
    rf"|\\*'(?:{_SCHEME}[ \t]+)?(?P<s2>[^'\\\r\n]+)"
    rf"|(?:{_SCHEME}[ \t]+)?(?P<s3>{_VALUE_CH}+=*))"
)
_KEY_ANCHORS = tuple(keyrule.ANCHORS)
# Where a token or a name may start (RE2 has no look-behind, so the character before
# is consumed, outside the masked group): the start, a non-word character, or an
# escape such as the \n of JSON text inside a string.
_ESCAPE = r"\\+[nrtfb]"
_LEFT = rf"(?:^|[^A-Za-z0-9_]|{_ESCAPE})"
_START = rf"(?:^|[^A-Za-z0-9_.\-]|{_ESCAPE})"
_SCHEMES = ("basic", "bearer", "digest", "token")


def _name_is_sensitive(name: str, secret: str) -> bool:
    if secret.lower() in _SCHEMES:
        return False  # "Authorization: Bearer [redacted]": the scheme word alone is no secret
    name = name.lstrip("-")
    if not keyrule.is_sensitive_key(name):
        return False
    return not (keyrule.is_count_key(name) and secret.isdigit() and secret.isascii())


def _is_basic_credential(_: str, secret: str) -> bool:
    try:
        decoded = base64.b64decode(secret + "=" * (-len(secret) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    return b":" in decoded


_B64 = r"[A-Za-z0-9+/]"
RULES: tuple[Rule, ...] = (
    Rule(
        "private_key",
        r"(?P<s>-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----(?s:.*?)"
        r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----|$))",
        ("private key",),
    ),
    Rule(
        "url_password",
        r"\b[A-Za-z][A-Za-z0-9+.\-]{0,30}://[^\s:/?#@\"'<>\\]*:(?P<s>[^\s/?#@\"'<>\\]+)@",
        ("://",),
    ),
    Rule("jwt", _LEFT + r"(?P<s>eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]*(?:\.[A-Za-z0-9_\-]*){0,2})", ("eyj",)),
    Rule("openai_anthropic_key", _LEFT + r"(?P<s>sk-[A-Za-z0-9_\-]{16,})", ("sk-",)),
    Rule("stripe_key", r"(?P<s>[sr]k_(?:live|test)_[A-Za-z0-9]{16,})", ("k_live_", "k_test_")),
    Rule("github_token", r"(?P<s>gh[pousr]_[A-Za-z0-9_]{20,}|github_pat_[A-Za-z0-9_]{20,})",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),),
    Rule("gitlab_token", r"(?P<s>glpat-[A-Za-z0-9_\-]{20,})", ("glpat-",)),
    Rule("slack_token", r"(?P<s>xox[abposre]-[A-Za-z0-9\-]{10,})", ("xox",)),
    Rule("sendgrid_key", r"(?P<s>SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,})", ("sg.",)),
    Rule("twilio_key", _LEFT + r"(?P<s>SK[0-9a-f]{32}\b)", (), exact_anchors=("SK",)),
    Rule("npm_token", r"(?P<s>npm_[A-Za-z0-9]{36,})", ("npm_",)),
    Rule("pypi_token", r"(?P<s>pypi-AgE[A-Za-z0-9_\-]{50,})", ("pypi-",)),
    Rule("huggingface_token", r"(?P<s>hf_[A-Za-z0-9]{30,})", ("hf_",)),
    Rule("google_api_key", r"(?P<s>AIza[0-9A-Za-z_\-]{35})", ("aiza",)),
    Rule(
        "aws_access_key_id",
        _LEFT + r"(?P<s>(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|APKA)[0-9A-Z]{16}\b)",
        ("akia", "asia", "abia", "acca", "agpa", "aida", "aroa", "aipa", "anpa", "anva", "apka"),
    ),
    Rule(
        "azure_key",
        r"(?:AccountKey|SharedAccessKey|SharedAccessSignature)=(?P<s>[^;\"'\s]{8,})|[?&]sig=(?P<s2>[A-Za-z0-9%+/=]{16,})",
        ("accountkey", "sharedaccess", "sig="),
    ),
    Rule("bearer", rf"{_LEFT}{ci('bearer')}[ \t]+(?P<s>[A-Za-z0-9._~+/\-]{{8,}}=*)", ("bearer",)),
    Rule("token_auth", rf"{_LEFT}{ci('token')}[ \t]+(?P<s>[A-Za-z0-9._~+/\-]*[0-9][A-Za-z0-9._~+/\-]*[A-Za-z][A-Za-z0-9._~+/\-]{{8,}}=*)", ("token",)),
    Rule("basic_auth", rf"{_LEFT}{ci('basic')}[ \t]+(?P<s>{_B64}{{8,}}={{0,2}})", ("basic",), _is_basic_credential),
    # Digest keeps username, realm and nonce visible: the response is the credential.
    Rule("digest_auth", rf"{_LEFT}{ci('digest')}[ \t]+[^\r\n]{{0,400}}?response=\\*\"?(?P<s>[0-9a-fA-F]{{16,}})", ("digest",)),
    # NAME=value, NAME: value, "NAME": "value", --name value (the name under the key rule)
    Rule(
        "name_value",
        rf"{_START}(?P<name>{_NAME})(?:\\*[\"'])?[ \t]*[:=][ \t]*{_VALUE}",
        _KEY_ANCHORS,
        _name_is_sensitive,
    ),
    Rule("name_value", rf"{_START}(?P<name>--{_NAME})[ \t]+{_VALUE}", _KEY_ANCHORS, _name_is_sensitive),
)


def _compile() -> tuple[re2._Regexp, list[tuple[int, str, tuple[int, ...], int | None, Callable | None]]]:
    parts = []
    groups = []
    for index, rule in enumerate(RULES):
        pattern = rule.pattern
        name_group = None
        if "(?P<name>" in pattern:
            name_group = f"r{index}name"
            pattern = pattern.replace("(?P<name>", f"(?P<{name_group}>")
        secret_groups = []
        for g in ("s", "s2", "s3"):
            if f"(?P<{g}>" in pattern:
                pattern = pattern.replace(f"(?P<{g}>", f"(?P<r{index}{g}>")
                secret_groups.append(f"r{index}{g}")
        parts.append(f"(?P<r{index}>{pattern})")
        groups.append((f"r{index}", rule.name, tuple(secret_groups), name_group, rule.verify))
    options = re2.Options()
    options.log_errors = False
    options.max_mem = 64 << 20
    regex = re2.compile(("|".join(parts)).encode(), options)
    index_of = {k.decode(): v for k, v in regex.groupindex.items()}  # Match.start() takes numbers only here
    numbered = [
        (index_of[outer], rule, tuple(index_of[g] for g in secret), None if name is None else index_of[name], verify)
        for outer, rule, secret, name, verify in groups
    ]
    return regex, numbered


_REGEX, _GROUPS = _compile()
_ANCHORS = tuple(sorted({a for rule in RULES for a in rule.anchors}))
_EXACT_ANCHORS = tuple(sorted({a for rule in RULES for a in rule.exact_anchors}))


def might_hold_secret(text: str) -> bool:
    """Whether any rule could match ``text`` (never False when one does)."""
    if len(text) < MIN_CHARS:
        return False
    if len(text) > PREFILTER_CHARS:
        return True
    lowered = text.lower()
    for anchor in _ANCHORS:
        if anchor in lowered:
            return True
    for anchor in _EXACT_ANCHORS:
        if anchor in text:
            return True
    return False


def find_secrets(data: bytes) -> list[Span]:
    """The byte spans of UTF-8 ``data`` to mask, in order, not overlapping, each
    with its rule. Spans start and end on character boundaries."""
    spans: list[Span] = []
    pos = 0
    end = len(data)
    search = _REGEX.search
    while pos < end:
        match = search(data, pos)
        if match is None:
            break
        for outer, rule, secret_groups, name_group, verify in _GROUPS:
            if match.start(outer) >= 0:
                break
        found = [(match.start(g), match.end(g)) for g in secret_groups if match.start(g) >= 0]
        if verify is not None:
            name = "" if name_group is None else data[match.start(name_group) : match.end(name_group)].decode("utf-8", "replace")
            start, stop = found[0]
            if not verify(name, data[start:stop].decode("utf-8", "replace")):
                # Not a secret: go on after the name (or the scheme word), so the
                # value is still scanned by every rule.
                pos = match.end(name_group) if name_group is not None else start
                pos = max(pos, match.start() + 1)
                continue
        for start, stop in found:
            if spans and start < spans[-1].end:  # the one character two matches may share
                start = spans[-1].end
            if start < stop:
                spans.append(Span(start, stop, rule))
        # Go on from the last character of this match: it may be the boundary the next
        # one needs ("token=a=b=c": the "=" ends one value and starts the next name).
        pos = max(match.end() - 1, match.start() + 1)
    return spans


def mask_text(text: str, replacement: str) -> tuple[str, tuple[str, ...]]:
    """``text`` with every secret replaced by ``replacement``, and the names of the
    rules that found them (empty when nothing was masked)."""
    if not might_hold_secret(text):
        return text, ()
    data = text.encode("utf-8", "surrogatepass")
    spans = find_secrets(data)
    if not spans:
        return text, ()
    out = bytearray()
    last = 0
    token = replacement.encode()
    for start, stop, _ in spans:
        out += data[last:start]
        out += token
        last = stop
    out += data[last:]
    masked = out.decode("utf-8", "surrogatepass")
    if masked == text:
        return text, ()
    return masked, tuple(sorted({span.rule for span in spans}))
