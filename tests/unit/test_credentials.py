"""The credential rules (core.credentials) and the amended key rule (core.keyrule):
examples, the prefilter's promise, and properties (embedded secrets are masked,
masking is idempotent)."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from secret_corpus import secret_cases
from stepstream.core import credentials, keyrule
from stepstream.core.credentials import RULES, find_secrets, mask_text, might_hold_secret
from stepstream.core.redact import REDACTED, mask_credentials, redact, scrub


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgres://admin:S3cretPassw0rd@db.internal:5432/prod", "postgres://admin:[redacted]@db.internal:5432/prod"),
        ("redis://:p4ss@cache:6379/0", "redis://:[redacted]@cache:6379/0"),
        ("curl -H 'X-Api-Key: 0123456789abcdef' https://x", "curl -H 'X-Api-Key: [redacted]' https://x"),
        ('{"X-Auth": "abcdef0123456789"}', '{"X-Auth": "[redacted]"}'),
        ('{"pwd": "hunter2hunter2"}', '{"pwd": "[redacted]"}'),
        ("Authorization: Basic YWRtaW46cGFzc3dvcmQ=", "Authorization: Basic [redacted]"),
        ("OPENAI_API_KEY=sk-abc123 python run.py", "OPENAI_API_KEY=[redacted] python run.py"),
        ("run --password hunter2 --verbose", "run --password [redacted] --verbose"),
        ("max_tokens=1024 and max_tokens=lots", "max_tokens=1024 and max_tokens=[redacted]"),
        ("line one\\nsk-proj-abcdefghijklmnopqrstuv", "line one\\n[redacted]"),
        ("Authorization: Bearer [redacted]", "Authorization: Bearer [redacted]"),
        ("We use Basic authentication here", "We use Basic authentication here"),
        ("bypass=route9 compass: north author=ann", "bypass=route9 compass: north author=ann"),
        ("task-abcdefghijklmnopqrstuvwxyz", "task-abcdefghijklmnopqrstuvwxyz"),
        ("https://user@example.com/path", "https://user@example.com/path"),
    ],
)  # fmt: skip
def test_mask_the_secret_keep_the_sentence(text, expected):
    assert mask_credentials(text) == expected
    assert mask_credentials(expected) == expected


def test_each_rule_is_named_in_what_it_masks():
    _, rules = mask_text("postgres://a:b@c and ghp_" + "a" * 36, REDACTED)
    assert rules == ("github_token", "url_password")


def test_every_pattern_is_also_valid_python_re():
    # Portable patterns (no RE2-only syntax), should the engine ever change.
    for rule in RULES:
        re.compile(rule.pattern)


def test_the_name_pattern_finds_every_sensitive_name_spelling():
    # The DFA half of the key rule must be a superset: every spelling the key rule
    # calls sensitive is a candidate, in each case style.
    words = [*keyrule.suffix_words(), *keyrule.EXACT_SEGMENTS] + [f"{a}_{b}" for a, b in keyrule.SENSITIVE_PHRASES]
    for word in words:
        for name in (word, "db_" + word, "X-" + word.upper(), "my" + word.title().replace("_", ""), word + "s"):
            if keyrule.is_sensitive_key(name):
                assert mask_credentials(f"{name}=hunter2x") == f"{name}=[redacted]", name


def test_keys_are_masked_and_pointers_name_the_masked_key():
    value, pointers, rules = redact({"Bearer abcdefgh12345": 1, "sk-proj-abcdefghijklmnopqrstuv": "x", "ok": 2})
    assert value == {"Bearer [redacted]": REDACTED, "[redacted]": "x", "ok": 2}
    assert pointers == ["/Bearer [redacted]", "/Bearer [redacted]", "/[redacted]"]
    assert rules == ["bearer", "key_name", "openai_anthropic_key"]
    two, _, _ = redact({"sk-proj-aaaaaaaaaaaaaaaaaaaa": 1, "sk-proj-bbbbbbbbbbbbbbbbbbbb": 2})
    assert two == {"[redacted]": 1, "[redacted]#2": 2}


@pytest.mark.parametrize(
    ("key", "value", "visible"),
    [
        ("max_tokens", 1024, True), ("maxTokens", 1024, True), ("max_new_tokens", 5, True),
        ("prompt_tokens", 10, True), ("completion_tokens", 10, True), ("input_tokens", 10, True),
        ("total_tokens", 10, True), ("cached_tokens", 0, True), ("reasoning-tokens", 7, True),
        ("max_token", 9, True), ("max_tokens", "1024", False), ("max_tokens", True, False),
        ("max_tokens", 10.5, False), ("max_tokens", {"a": 1}, False), ("auth_tokens", 5, False),
        ("secret_max_tokens", 5, False), ("token", 5, False), ("tokens", 5, False), ("refresh_token", 5, False),
        ("token_count", 5, False),
    ],
)  # fmt: skip
def test_token_counts_stay_visible_only_as_integers(key, value, visible):
    out = redact({"usage": {key: value}}).value["usage"][key]
    assert (out == value) is visible


@pytest.mark.parametrize("key", ["X-Auth", "auth", "pwd", "db_pass", "dbPass", "DB_PASS", "x.pwd", "PWD"])
def test_new_exact_segments_are_sensitive(key):
    assert keyrule.is_sensitive_key(key)


@pytest.mark.parametrize("key", ["author", "oauth_flow", "bypass", "compass", "passage", "pwdx", "Authors"])
def test_exact_segments_are_whole_segments(key):
    assert not keyrule.is_sensitive_key(key)


def test_scrub_masks_then_clips_and_takes_structures():
    long = "x" * 300 + " token=abc123 " + "y" * 10
    assert scrub(long).endswith("[clipped]") and len(scrub(long)) == 256 and "abc123" not in scrub(long)
    assert scrub("claude-sonnet/sk-proj-abcdefghijklmnopqrstuv") == "claude-sonnet/[redacted]"
    failure = {"type": "ToolError", "message": "db at postgres://a:hunter22@db failed", "step": 3}
    assert scrub(failure, 2048) == {"type": "ToolError", "message": "db at postgres://a:[redacted]@db failed", "step": 3}
    assert scrub({"region": "eu", "api_key": "k"}) == {"region": "eu", "api_key": REDACTED}
    assert scrub(None) is None and scrub(7) == 7
    assert scrub(scrub(long)) == scrub(long)


# -- properties --------------------------------------------------------------------

SECRETS = secret_cases(seed=21, rounds=1)
_SEPARATORS = " \t\n,;|()[]{}<>\"'"  # a secret is a word of its own: "tasksk-..." is not one
_noise = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)


@settings(max_examples=400, deadline=None, print_blob=True)
@given(before=_noise, after=_noise, index=st.integers(0, len(SECRETS) - 1), left=st.sampled_from(_SEPARATORS),
       right=st.sampled_from(_SEPARATORS))  # fmt: skip
def test_a_secret_embedded_anywhere_is_masked(before, after, index, left, right):
    case = SECRETS[index]
    text = before + left + case.text + right + after
    masked = mask_credentials(text)
    assert case.secret not in masked
    assert mask_credentials(masked) == masked


_alphabet = st.sampled_from(
    list("abcXYZ019 _-.:=/@'\"\\\n") + ["sk-", "ghp_", "eyJ", "://", "password", "Bearer ", "Basic ", "token=",
                                         "AKIA", "-----BEGIN RSA PRIVATE KEY-----", "[redacted]", "max_tokens=", "é"]
)  # fmt: skip


@settings(max_examples=500, deadline=None, print_blob=True)
@given(st.lists(_alphabet, max_size=40).map("".join))
def test_masking_is_idempotent_and_the_prefilter_never_hides_a_match(text):
    masked = mask_credentials(text)
    assert mask_credentials(masked) == masked
    spans, _ = find_secrets(text.encode("utf-8", "surrogatepass"))
    if spans and len(text) >= credentials.MIN_CHARS:
        assert might_hold_secret(text)


@settings(max_examples=300, deadline=None, print_blob=True)
@given(st.lists(_alphabet, max_size=40).map("".join), st.integers(0, 80))
def test_the_direct_re2_calls_agree_with_the_wrappers(text, pos):
    """credentials binds the pinned google-re2's C++ ``Set.Match`` and ``RE2.Match``
    past its Python wrappers: they must say what the wrappers say."""
    data = text.encode("utf-8", "surrogatepass")
    for (rule_set, _), (match, _) in zip(credentials._SETS, credentials._SET_MATCHES):
        assert sorted(match(data)) == sorted(rule_set.Match(data) or [])
    pos = min(pos, len(data))
    for rule in credentials._COMPILED:
        spans = rule.match(credentials._UNANCHORED, data, pos, len(data))
        found = rule.regex.search(data, pos)
        if found is None:
            assert spans[0] == (-1, -1)
        else:
            assert spans == [found.span(g) for g in range(rule.regex.groups + 1)]


@settings(max_examples=300, deadline=None, print_blob=True)
@given(st.lists(_alphabet, max_size=40).map("".join))
def test_the_sets_report_exactly_the_rules_that_match_alone(text):
    """The rules are split over several RE2 sets (SET_GROUPS): together they say, for
    every rule, whether it matches somewhere, as the rule compiled alone does."""
    data = text.encode("utf-8", "surrogatepass")
    alone = [i for i, rule in enumerate(credentials._COMPILED) if rule.regex.search(data) is not None]
    assert credentials.rules_matching(data) == alone
    long = data + b" " * credentials.LONG_TEXT  # the one set of every rule
    assert credentials.rules_matching(long) == [i for i, r in enumerate(credentials._COMPILED) if r.regex.search(long)]


def test_every_rule_is_in_exactly_one_set():
    *short, (_, every) = credentials._SETS
    assert sorted(i for _, members in short for i in members) == list(range(len(RULES)))
    assert every == tuple(range(len(RULES)))
    named = {name for group in credentials.SET_GROUPS for name in group}
    assert named <= {rule.name for rule in RULES}  # a renamed rule would silently rejoin the shared set


def test_the_set_pass_skips_ordinary_text():
    assert not might_hold_secret("the invoice total looks doubled because retry charged twice")
    assert might_hold_secret("x ghp_" + "a" * 36)


def test_a_string_of_nothing_but_matches_is_bounded_and_fail_closed():
    text = "max_tokens=1 " * 1000  # refused candidates: counts
    masked = mask_credentials(text)
    assert masked.startswith("max_tokens=1 " * 200) and masked.endswith(REDACTED)
    assert masked == mask_credentials(masked)


def test_a_long_secret_run_is_masked_whole():
    rng = random.Random(3)
    token = "ghp_" + "".join(rng.choices("abcdefXYZ0123", k=100_000))
    assert mask_credentials(f"a {token} b") == "a [redacted] b"


# -- through the engine ------------------------------------------------------------


def test_llm_steps_keep_their_token_counts():
    from fold_support import Script, fold_all

    s = Script()
    params = {"max_tokens": 1024, "temperature": 0.2, "max_tokens_hint": "x", "api_key": "k", "maxOutputTokens": 64}
    s("llm_request", call_id="l", provider="anthropic", model="claude", input="hi", params=params)
    _, outs = fold_all(s.events)
    step = outs[0].steps[0]
    assert step.arguments == {"max_tokens": 1024, "temperature": 0.2, "max_tokens_hint": REDACTED, "api_key": REDACTED,
                              "maxOutputTokens": 64}  # fmt: skip


def test_free_text_fields_are_scrubbed_and_capped():
    from fold_support import Script, fold_all

    secret = "sk-proj-" + "Q" * 30
    s = Script()
    s("run_start", agent_name="bot " + secret, environment="prod " + "e" * 400)
    s("llm_request", call_id="l", provider="p", model="m/" + secret + "x" * 400, input="hi")
    s("state_change", key="k " + secret + "y" * 400, value=1)
    s("error", message="boom", kind="kind " + secret)
    s("run_end", status="failed", failure="failed with " + secret)
    store, outs = fold_all(s.events)
    labels = [step.label for out in outs for step in out.steps]
    run = store.runs[("acme", "r1")]
    for text in [*labels, run.agent_name, run.environment, run.failure.type, run.failure.message]:
        assert secret not in text and len(text) <= 2048
    assert all(len(label) <= 256 for label in labels) and len(run.environment) == 256
    assert "[redacted]" in run.agent_name and run.failure.message == "failed with [redacted]"
