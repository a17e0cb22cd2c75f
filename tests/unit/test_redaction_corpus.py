"""A generated redaction corpus (>= 200 cases) pushed through the engine: every canary
secret is masked on the step and kept verbatim in the deep companion."""

from __future__ import annotations

import msgspec
import pytest
from fold_support import Script, fold_all
from stepstream.core.redact import SENSITIVE_PHRASES, SENSITIVE_WORDS, redact

# Every base name as its segments: single words and two-word phrases.
BASES = [[w] for w in SENSITIVE_WORDS] + [list(p) for p in SENSITIVE_PHRASES]


def styles(segs: list[str]) -> dict[str, str]:
    camel = "".join(s.capitalize() for s in segs)
    return {
        "snake": "db_" + "_".join(segs),
        "camel": "db" + camel,
        "pascal": "Db" + camel,
        "kebab": "x-" + "-".join(segs),
        "dotted": "cfg." + ".".join(segs),
        "spaced": "my " + " ".join(segs),
        "upper": "DB_" + "_".join(s.upper() for s in segs),
        "plural": "_".join(segs) + "s",
    }


def place(n: int, key: str, secret: str):
    """Put ``{key: secret}`` somewhere: top level, nested, in a list, deep in lists."""
    inner = {"visible": "ok", key: secret if n % 3 else {"wrapped": [secret, {"more": secret}]}}
    where = n % 4
    if where == 0:
        return inner
    if where == 1:
        return {"a": {"b": {"c": inner}}, "note": "fine"}
    if where == 2:
        return {"items": [{"id": 1}, inner, "text"]}
    return {"l1": [[{"l3": [inner]}]]}


def credential_values(canary: str) -> list[str]:
    """Credential-shaped strings holding ``canary`` (uppercase letters and digits)."""
    return [
        f"sk-proj-{canary}abcdefghij",
        f"sk-{canary}ABCDEFGHIJKLMN",
        f"ghp_{canary}abcdefghijklmnopqrstu",
        f"gho_{canary}abcdefghijklmnopqrstu",
        f"ghu_{canary}abcdefghijklmnopqrstu",
        f"ghs_{canary}abcdefghijklmnopqrstu",
        f"ghr_{canary}abcdefghijklmnopqrstu",
        f"github_pat_{canary}_abcdefghijklmnopqrstu",
        f"Authorization: Bearer {canary}.abc.def",
        f"curl -H 'authorization: bearer {canary}xyz' https://x",
        f"-----BEGIN RSA PRIVATE KEY-----\nMII{canary}\nabc\n-----END RSA PRIVATE KEY-----",
        f"-----BEGIN PRIVATE KEY-----\n{canary}\n-----END PRIVATE KEY-----",
        f"-----BEGIN OPENSSH PRIVATE KEY-----\n{canary} (cut off)",
        f"AKIA{canary[:16].ljust(16, 'Q')}",
        f"xoxb-{canary}-12345",
    ]


def build_cases() -> list[tuple[str, dict, str]]:
    cases = []
    n = 0
    for segs in BASES:
        for style, key in styles(segs).items():
            canary = f"CANARY{n:04d}X"
            cases.append((f"key-{style}-{key}", place(n, key, f"v-{canary}"), canary))
            n += 1
    for placement in range(3):
        for value in credential_values("PLACEHOLDER"):
            canary = f"CANARY{n:04d}X"
            text = value.replace("PLACEHOLDER", canary)
            doc = [{"note": text}, {"cmd": ["run", text]}, {"a": {"b": [{"c": "before " + text}]}}][placement]
            cases.append((f"value-{placement}-{text[:14]}", doc, canary))
            n += 1
    for depth in (33, 40, 64, 200):
        canary = f"CANARY{n:04d}X"
        doc: dict = {"note": f"innocent {canary}"}
        for i in range(depth):
            doc = {f"level{i % 3}": doc} if i % 2 else {"list": [doc]}
        cases.append((f"deep-{depth}", doc, canary))
        n += 1
    canary = f"CANARY{n:04d}X"
    cases.append(("wide", {"rows": [0] * 5999 + [f"innocent {canary}"]}, canary))  # past the node budget
    return cases


CASES = build_cases()


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 200
    assert len({c[2] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("name", "arguments", "canary"), CASES, ids=[c[0] for c in CASES])
def test_masked_on_steps_kept_in_deep(name, arguments, canary):
    s = Script()
    s("tool_call", call_id="c", tool="t", arguments=arguments)
    s("state_change", key="config", value=arguments)
    s("llm_request", call_id="l", provider="p", model="m", input="hi", params=arguments)
    store, outs = fold_all(s.events)
    visible = msgspec.json.encode([[o.steps, o.run, o.state] for o in outs]).decode()
    assert canary not in visible
    for ordinal in (0, 1):
        deep = store.deeps[("acme", "r1", ordinal)]
        assert deep.arguments == arguments and not deep.clipped  # kept as the JSON value
        assert canary in msgspec.json.encode(deep.arguments).decode()
    _, pointers, _ = redact(arguments)
    assert pointers and all(canary not in p for p in pointers)
