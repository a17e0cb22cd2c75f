"""The second line of redaction: credential formats found inside any string.

:func:`mask_text` replaces every credential in a string with ``[redacted]`` and
keeps the rest of the sentence (``postgres://admin:[redacted]@db:5432/prod``), and
says which rules (:data:`RULES`) found them; ``core.redact`` applies it to every
string and key an operator sees.

**Linear time, one pass or three.** The rules are RE2 programs (``google-re2``), which
run in time linear in the text whatever it holds. They form RE2 *sets*: one DFA pass
over the text per set says which rules match anywhere, three sets for a short string
(:data:`SET_GROUPS`, 2-3 us in all for text new to them), one set of every rule for a
long one (about one plain scan for 1 MiB), so ordinary text and near-matches cost
those passes and nothing else. Only a rule a set reports is then run on its own (a
small program) to find its matches. Python's backtracking ``re`` was measured against
it (``docs/redaction.md``, ``python -m benchmarks.bench_redact``): it either tries
every rule at every position or scans once per rule, hundreds of times slower on 1 MiB
of near-matches. RE2 has no look-around: boundaries are ``\\b`` or a consumed
character outside the masked group; every pattern also compiles under Python ``re``.

**Union.** Each reported rule masks all its matches; overlapping spans merge. So a
rule never hides another's match (``password=ghp_...`` is masked by both).

**Verification.** One rule asks Python after RE2: ``name_value`` (is the name
sensitive under ``core.keyrule``, and is it a token *count* holding an integer?).
A candidate it refuses is not masked; its value is still scanned.

**Match budget.** Each match costs a few microseconds through the Python binding.
After :data:`MAX_MATCHES` matches (or refused candidates) of one rule in one string,
the rest of that string is masked whole (rule ``match_budget``): a string that is
nothing but credentials costs at most that many, fail-closed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import re2

from stepstream.core import keyrule

__all__ = ["MAX_MATCHES", "MIN_CHARS", "RULES", "Rule", "Span", "find_secrets", "mask_text", "might_hold_secret"]

MIN_CHARS = 5  # no rule matches fewer characters ("pwd=x")
MAX_MATCHES = 256  # per string; past it the rest of the string is masked (fail-closed)


def ci(word: str) -> str:
    """``word`` matched ASCII-case-insensitively (RE2's ``(?i)`` folds Unicode too,
    and Python's does not: spelled out, both engines agree)."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in word)


def _alt(words: list[str]) -> str:
    return "(?:" + "|".join(sorted(words, key=len, reverse=True)) + ")"


class Rule(NamedTuple):
    name: str
    pattern: str  # RE2 (and Python re) syntax; groups named s, s2, ... are masked
    verify: Callable[[str, str], bool] | None = None  # (name group, secret) -> mask it?


class Span(NamedTuple):
    start: int
    end: int
    rule: str


# -- the key rule, as a DFA ------------------------------------------------------
# A name is sensitive when a segment is or ends with a word (core.redact). In a DFA:
# the word, case-insensitively, followed by something that is not a lower-case
# letter (a segment cannot continue there). Exact segments (auth, pwd, pass) need a
# segment start before them too. This is a superset; keyrule.is_sensitive_key decides.

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


_TOKEN_CH = r"[A-Za-z0-9._~+/\-]"
_B64 = r"[A-Za-z0-9+/]"
_NOT_LOWER = r"[A-Z0-9+/]"
_BASIC = (
    "(?:" + "|".join(f"{_B64}[a-z]{{{k}}}{_NOT_LOWER}{_B64}{{{6 - k},}}" for k in range(6))
    + f"|{_B64}[a-z]{{6,}}{_NOT_LOWER}{_B64}*)={{0,2}}"
)  # fmt: skip
RULES: tuple[Rule, ...] = (
    Rule(
        "private_key",
        r"(?P<s>-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----(?s:.*?)"
        r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----|$))",
    ),
    Rule("url_password", r"\b[A-Za-z][A-Za-z0-9+.\-]{0,30}://[^\s:/?#@\"'<>\\]*:(?P<s>[^\s/?#@\"'<>\\]+)@"),
    Rule("jwt", _LEFT + r"(?P<s>eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}(?:\.[A-Za-z0-9_\-]*){1,3})"),
    Rule("openai_anthropic_key", _LEFT + r"(?P<s>sk-[A-Za-z0-9_\-]{16,})"),
    Rule("stripe_key", r"(?P<s>[sr]k_(?:live|test)_[A-Za-z0-9]{16,})"),
    Rule("github_token", r"(?P<s>gh[pousr]_[A-Za-z0-9_]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
    Rule("gitlab_token", r"(?P<s>glpat-[A-Za-z0-9_\-]{20,})"),
    Rule("slack_token", r"(?P<s>xox[abposre]-[A-Za-z0-9\-]{10,})"),
    Rule("sendgrid_key", r"(?P<s>SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,})"),
    Rule("twilio_key", _LEFT + r"(?P<s>SK[0-9a-f]{32}\b)"),
    Rule("npm_token", r"(?P<s>npm_[A-Za-z0-9]{36,})"),
    Rule("pypi_token", r"(?P<s>pypi-AgE[A-Za-z0-9_\-]{50,})"),
    Rule("huggingface_token", r"(?P<s>hf_[A-Za-z0-9]{30,})"),
    Rule("google_api_key", r"(?P<s>AIza[0-9A-Za-z_\-]{35})"),
    Rule(
        "aws_access_key_id",
        _LEFT + r"(?P<s>(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|APKA)[0-9A-Z]{16}\b)",
    ),
    Rule(
        "azure_key",
        r"(?:AccountKey|SharedAccessKey|SharedAccessSignature)=(?P<s>[^;\"'\s]{8,})"
        r"|[?&]sig=(?P<s2>[A-Za-z0-9%+/=]{16,})",
    ),
    Rule("bearer", rf"{_LEFT}{ci('bearer')}[ \t]+(?P<s>[A-Za-z0-9._~+/\-]{{8,}}=*)"),
    # Token: a digit, later a letter, ten characters or more ("Token count 4096" is prose).
    Rule(
        "token_auth",
        rf"{_LEFT}{ci('token')}[ \t]+(?P<s>{_TOKEN_CH}*[0-9]{_TOKEN_CH}*[A-Za-z]{_TOKEN_CH}{{8,}}=*)",
    ),
    # base64 of user:password: eight or more characters, one past the first not a
    # lower-case letter ("Basic authentication" is prose, "Basic YWRtaW46..." is not).
    Rule("basic_auth", rf"{_LEFT}{ci('basic')}[ \t]+(?P<s>{_BASIC})"),
    # Digest keeps username, realm and nonce visible: the response is the credential.
    Rule(
        "digest_auth",
        rf"{_LEFT}{ci('digest')}[ \t]+(?:[A-Za-z\-]+=(?:\\*\"[^\"\\\r\n]*\\*\"|[^\s,\"\\]*),[ \t]*)*"
        r"response=\\*\"?(?P<s>[0-9a-fA-F]{16,})",
    ),
    # NAME=value, NAME: value, "NAME": "value", --name=value; then --name value
    Rule(
        "name_value",
        rf"{_START}(?P<name>{_NAME})(?:\\*[\"'])?[ \t]*[:=][ \t]*{_VALUE}",
        _name_is_sensitive,
    ),
    Rule("name_value", rf"{_START}(?P<name>--{_NAME})[ \t]+{_VALUE}", _name_is_sensitive),
)

class _Compiled(NamedTuple):
    name: str
    regex: re2._Regexp
    match: Callable[[Any, bytes, int, int], list[tuple[int, int]]]  # the RE2 object's own Match
    secret_groups: tuple[int, ...]
    name_group: int | None
    verify: Callable[[str, str], bool] | None


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False
    return options


# How the rules are split over RE2 sets for a short string (by name; every other rule
# shares the last set). A set of all the rules is one DFA pass, but its DFA is the
# product of the rules' automata, and text new to it (a random token, an id) makes
# RE2 build states as it reads: on the bench corpora's tool arguments and prompts,
# 5.7-9.6 us per string for the one set against 2.4-2.9 us for three passes over
# these three, the name_value rules and url_password being what multiplies the
# states. A long string (:data:`LONG_TEXT` bytes or more) takes the one set: over a
# long text the states it builds are reused, and one pass is a third of three.
# Which rules a set reports is a property of each rule alone: either way gives the
# same rules.
SET_GROUPS: tuple[tuple[str, ...], ...] = (("name_value",), ("url_password",))
LONG_TEXT = 4096


def _compile() -> tuple[list[tuple[re2.Set, tuple[int, ...]]], list[_Compiled]]:
    """The RE2 sets (each with the index in :data:`RULES` of its n-th pattern): one
    per group of :data:`SET_GROUPS`, the rest, then all the rules; and each rule
    compiled on its own."""
    compiled = []
    members: list[list[int]] = [[] for _ in range(len(SET_GROUPS) + 1)]
    members.append(list(range(len(RULES))))
    for i, rule in enumerate(RULES):
        pattern = rule.pattern.encode()
        regex = re2.compile(pattern, _options())
        index = {k.decode(): v for k, v in regex.groupindex.items()}  # Match.start() takes numbers only
        groups = tuple(index[g] for g in ("s", "s2", "s3") if g in index)
        compiled.append(_Compiled(rule.name, regex, regex._regexp.Match, groups, index.get("name"), rule.verify))
        members[next((k for k, names in enumerate(SET_GROUPS) if rule.name in names), len(SET_GROUPS))].append(i)
    sets = []
    for indices in members:
        rule_set = re2.Set.SearchSet(_options())
        for n, i in enumerate(indices):
            if rule_set.Add(RULES[i].pattern.encode()) != n:
                raise AssertionError(f"rule {RULES[i].name} did not get its index in its set")
        rule_set.Compile()
        sets.append((rule_set, tuple(indices)))
    return sets, compiled


_SETS, _COMPILED = _compile()
# The C++ objects' own methods, past the Python wrappers of ``re2/__init__.py`` (which
# build a generator and a match object per search, about half of a short string's
# cost): ``Set.Match(bytes)`` gives the indices of the set's patterns that match (an
# empty list for none), ``RE2.Match(anchor, bytes, pos, endpos)`` the (start, end)
# byte span of the match and of each group, ``(-1, -1)`` for none. Both are private
# names of the pinned google-re2; ``tests/unit/test_credentials.py`` checks them
# against the wrappers.
_SET_MATCHES = tuple((rule_set._set.Match, indices) for rule_set, indices in _SETS)
_SHORT_MATCHES, _ALL_MATCH = _SET_MATCHES[:-1], _SET_MATCHES[-1][0]
_UNANCHORED = re2._Anchor.UNANCHORED
_NO_SPAN = (-1, -1)


def rules_matching(data: bytes) -> list[int]:
    """The indices in :data:`RULES` of the rules that match somewhere in UTF-8 ``data``,
    in order (a pass per set of :data:`SET_GROUPS` and the rest, or one pass for a
    long string)."""
    if len(data) >= LONG_TEXT:
        return sorted(_ALL_MATCH(data))
    hits: list[int] = []
    for match, indices in _SHORT_MATCHES:
        found = match(data)
        if found:
            hits.extend(indices[n] for n in found)
    if len(hits) > 1:
        hits.sort()
    return hits


def might_hold_secret(text: str) -> bool:
    """Whether any rule matches somewhere in ``text`` (a pass per RE2 set)."""
    if len(text) < MIN_CHARS:
        return False
    return bool(rules_matching(text.encode("utf-8", "surrogatepass")))


def _rule_spans(rule: _Compiled, data: bytes, spans: list[Span]) -> None:
    match = rule.match
    end = len(data)
    pos = 0
    for _ in range(MAX_MATCHES):
        groups = match(_UNANCHORED, data, pos, end)
        whole = groups[0]
        if whole == _NO_SPAN:
            return
        found = [groups[g] for g in rule.secret_groups if groups[g][0] >= 0]
        if rule.verify is not None:
            name_span = None if rule.name_group is None else groups[rule.name_group]
            name = "" if name_span is None else data[name_span[0] : name_span[1]].decode("utf-8", "replace")
            start, stop = found[0]
            if not rule.verify(name, data[start:stop].decode("utf-8", "replace")):
                # Not a secret: go on after the name, its value may start the next one.
                pos = max(start if name_span is None else name_span[1], whole[0] + 1)
                continue
        spans.extend(Span(start, stop, rule.name) for start, stop in found if start < stop)
        # From the last character of this match: it may be the boundary the next
        # one needs ("token=a=b": the "=" ends one value and starts the next name).
        pos = max(whole[1] - 1, whole[0] + 1)
        if pos >= end:
            return
    # Past the budget: the rest is masked whole, from a character boundary on.
    start = pos
    while start < end and data[start] & 0xC0 == 0x80:
        start += 1
    if start < end:
        spans.append(Span(start, end, "match_budget"))


def find_secrets(data: bytes) -> tuple[list[Span], tuple[str, ...]]:
    """The byte spans of UTF-8 ``data`` to mask, sorted, overlapping ones merged (a
    merged span keeps the rule of its first part), and the names of every rule that
    masked something. Spans start and end on character boundaries."""
    hits = rules_matching(data)
    if not hits:
        return [], ()
    found: list[Span] = []
    for index in hits:
        _rule_spans(_COMPILED[index], data, found)
    rules = tuple(sorted({span.rule for span in found}))
    found.sort()
    merged: list[Span] = []
    for span in found:
        if merged and span.start < merged[-1].end:
            last = merged[-1]
            merged[-1] = Span(last.start, max(last.end, span.end), last.rule)
        else:
            merged.append(span)
    return merged, rules


def mask_text(text: str, replacement: str) -> tuple[str, tuple[str, ...]]:
    """``text`` with every credential replaced by ``replacement``, and the names of the
    rules that found them (empty when nothing was masked)."""
    if len(text) < MIN_CHARS:
        return text, ()
    data = text.encode("utf-8", "surrogatepass")
    spans, rules = find_secrets(data)
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
    return masked, rules
