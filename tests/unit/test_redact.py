"""Redaction: key names, credential-shaped values, fail-closed budgets, pointers."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stepstream.core.redact import REDACTED, is_sensitive_key, key_segments, mask_credentials, redact


@pytest.mark.parametrize(
    "key",
    [
        "password", "Password", "db_password", "dbPassword", "DB-PASSWORD", "db.password", "db password",
        "passwords", "passwd", "secret", "clientSecret", "client_secrets", "token", "accessToken",
        "refresh-token", "id_token", "auth_tokens", "x-auth-token", "apikey", "apiKey", "APIKey", "API_KEY",
        "x-api-key", "api key", "openaiApiKey", "api.keys", "authorization", "Authorization",
        "proxy-authorization", "bearer", "credential", "credentials", "aws_credentials", "session",
        "sessionId", "session_id", "cookie", "Set-Cookie", "cookies", "signature", "x-hub-signature",
        "privatekey", "privateKey", "private_key", "PRIVATE-KEYS", "aws_access_key_id", "secretKey",
        "signing_key", "encryption-key", "passphrase", "pass_phrase", "myapikey", "githubtoken",
        "max_tokens",  # a count key: only an integer under it stays visible
    ],
)  # fmt: skip
def test_sensitive_keys(key):
    assert is_sensitive_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "tokenizer", "author", "monkey", "key", "keyboard", "keys", "api", "primary_key", "passage",
        "description", "max_output", "sessionize", "secretary", "cookiecutter", "signed", "private",
        "access", "url", "headers", "Accept", "", "ключ", "名前",
    ],
)  # fmt: skip
def test_innocent_keys(key):
    assert not is_sensitive_key(key)


def test_segments():
    assert key_segments("XMLHttpAPIKey2") == ["xml", "http", "api", "key", "2"]
    assert key_segments("x-api.key value") == ["x", "api", "key", "value"]


def test_values_under_sensitive_keys_are_replaced_whole_and_not_walked():
    value = {"user": "ann", "password": {"nested": ["a", {"b": 1}]}, "list": [{"apiKey": 7}, {"ok": True}]}
    original = copy.deepcopy(value)
    out, pointers, _ = redact(value)
    assert out == {"user": "ann", "password": REDACTED, "list": [{"apiKey": REDACTED}, {"ok": True}]}
    assert pointers == ["/password", "/list/0/apiKey"]
    assert value == original  # never mutates its input


def test_pointers_escape_per_rfc6901():
    _, pointers, _ = redact({"a/b": {"c~d": {"token": 1}}})
    assert pointers == ["/a~1b/c~0d/token"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("key sk-proj-abcdefghijklmnopqrstuv end", "key [redacted] end"),
        ("sk-ant-api03-abcdefghijklmnop", "[redacted]"),
        ("ghp_" + "a" * 36, "[redacted]"),
        ("x gho_" + "B1" * 15 + " y", "x [redacted] y"),
        ("github_pat_" + "11ABC_" * 5, "[redacted]"),
        ("Authorization: Bearer eyJhbGciOi.payload.sig", "Authorization: Bearer [redacted]"),
        ("bearer abcdefgh12", "bearer [redacted]"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIxyz\n-----END RSA PRIVATE KEY-----\ntail", "[redacted]\ntail"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----\ntruncated", "[redacted]"),
        ("AKIAABCDEFGHIJKLMNOP", "[redacted]"),
        ("task-abcdefghijklmnopqrstuvwxyz", "task-abcdefghijklmnopqrstuvwxyz"),  # not an sk- key
        ("ask-me-anything-please-now", "ask-me-anything-please-now"),
        ("Bearer token", "Bearer token"),  # too short to be a credential
        ("short", "short"),
    ],
)  # fmt: skip
def test_credential_shaped_values(text, expected):
    assert mask_credentials(text) == expected
    assert mask_credentials(expected) == expected  # idempotent


def test_value_masking_records_the_pointer_and_can_be_turned_off():
    value = {"cmd": ["run", "--key=sk-abcdefghijklmnopqrstuvwx"]}
    out, pointers, _ = redact(value)
    assert out == {"cmd": ["run", "--key=[redacted]"]} and pointers == ["/cmd/1"]
    assert redact(value, mask_values=False) == (value, [], [])


def test_depth_budget_is_fail_closed():
    deep: dict = {"leaf": "visible"}
    for _ in range(40):
        deep = {"level": deep}
    out, pointers, _ = redact(deep, max_depth=32)
    node = out
    for _ in range(32):
        node = node["level"]
    assert node == REDACTED and pointers == ["/" + "/".join(["level"] * 32)]
    shallow, none, _ = redact({"level": {"level": {"leaf": 1}}}, max_depth=32)
    assert none == [] and shallow["level"]["level"]["leaf"] == 1


def test_node_budget_is_fail_closed():
    wide = {"ok": [1, 2], "big": list(range(6000))}
    out, pointers, _ = redact(wide, max_nodes=5000)
    assert out == {"ok": [1, 2], "big": REDACTED} and pointers == ["/big"]
    assert redact(list(range(10)), max_nodes=5) == (REDACTED, [""], ["budget"])


SECRET = "ZZSECRETZZ"
json_leaves = st.one_of(st.integers(), st.booleans(), st.none(), st.text(max_size=8))
innocent = st.sampled_from(["a", "name", "items", "url", "Accept", "kéy", "x-y"])
sensitive = st.sampled_from(["password", "apiKey", "X-API-KEY", "client.secret", "session id", "Cookies", "authToken"])


@st.composite
def documents(draw, depth: int = 0):
    if depth > 4 or draw(st.booleans()):
        return draw(json_leaves)
    if draw(st.booleans()):
        return [draw(documents(depth + 1)) for _ in range(draw(st.integers(0, 3)))]
    doc = {}
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.integers(0, 3)) == 0:
            doc[draw(sensitive)] = draw(st.sampled_from([SECRET, [SECRET], {"inner": SECRET}, {"a": [SECRET, 1]}]))
        else:
            doc[draw(innocent)] = draw(documents(depth + 1))
    return doc


@settings(max_examples=300, deadline=None, print_blob=True)
@given(documents())
def test_no_secret_survives_and_everything_else_does(doc):
    out, pointers, _ = redact(doc)
    assert SECRET not in repr(out)
    assert all(SECRET not in p for p in pointers)
    if not pointers:
        assert out == doc
