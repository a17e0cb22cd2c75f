"""The tokens file: only digests stored, mode 0600, atomic writes, re-read on change,
revocation, malformed tokens and files."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from stepstream.api.tokens import TokenRegistry, TokensUnavailable, add_token, list_tokens, revoke_token
from stepstream.cli import main
from stepstream.errors import ConfigError

NOW = "2026-11-29T12:00:00Z"


def test_add_stores_only_a_salted_digest_with_mode_0600(tmp_path):
    path = tmp_path / "tokens.json"
    token, entry = add_token(path, "acme", ["deep:read", "steps:read"], created=NOW)
    secret = token.split("_", 2)[2]
    raw = path.read_text()
    assert secret not in raw and token not in raw
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert entry.scopes == ["steps:read", "deep:read"]
    assert [e.id for e in list_tokens(path)] == [entry.id]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # Two tokens with one secret would still have unrelated digests (per-entry salt).
    _, other = add_token(path, "acme", ["steps:read"], created=NOW)
    assert other.salt != entry.salt and other.digest != entry.digest


def test_registry_authenticates_and_rereads_on_change(tmp_path):
    path = tmp_path / "tokens.json"
    registry = TokenRegistry(path)
    assert registry.authenticate("sst_0123456789ab_" + "A" * 43) is None  # no file: nothing is valid
    token, entry = add_token(path, "acme", ["steps:read"], created=NOW)
    principal = registry.authenticate(token)
    assert principal is not None and principal.company == "acme" and principal.scopes == {"steps:read"}
    assert principal.token_id == entry.id
    later, _ = add_token(path, "globex", ["deep:read"], created=NOW)
    assert registry.authenticate(later).company == "globex"
    assert revoke_token(path, entry.id, revoked=NOW)
    assert registry.authenticate(token) is None
    assert not revoke_token(path, entry.id, revoked=NOW)  # already revoked
    assert [e.revoked for e in list_tokens(path)] == [NOW, None]


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # wrong secret
        lambda t: t.replace("sst_", "sst-"),
        lambda t: t + "x",
        lambda t: t + "\n",  # ``$`` alone would match before it
        lambda t: "",
        lambda t: t.split("_")[1],  # the id alone
        lambda t: "sst_" + "f" * 12 + "_" + t.split("_", 2)[2],  # right secret, other id
    ],
)
def test_malformed_or_altered_tokens_are_refused(tmp_path, mangle):
    path = tmp_path / "tokens.json"
    token, _ = add_token(path, "acme", ["steps:read"], created=NOW)
    assert TokenRegistry(path).authenticate(mangle(token)) is None


def test_a_corrupt_file_fails_closed(tmp_path):
    path = tmp_path / "tokens.json"
    token, _ = add_token(path, "acme", ["steps:read"], created=NOW)
    registry = TokenRegistry(path)
    assert registry.authenticate(token) is not None
    path.write_text('{"version": 1, "tokens": [')
    with pytest.raises(TokensUnavailable):
        registry.authenticate(token)


@pytest.mark.parametrize(
    "company, scopes",
    [("bad company", ["steps:read"]), ("acme\n", ["steps:read"]), ("acme", []), ("acme", ["admin"])],
)
def test_add_refuses_bad_company_or_scopes(tmp_path, company, scopes):
    with pytest.raises(ConfigError):
        add_token(tmp_path / "t.json", company, scopes, created=NOW)
    assert not (tmp_path / "t.json").exists()


def test_concurrent_adds_lose_nothing(tmp_path):
    path = tmp_path / "tokens.json"
    threads = [threading.Thread(target=add_token, args=(path, "acme", ["steps:read"]), kwargs={"created": NOW})
               for _ in range(8)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({e.id for e in list_tokens(path)}) == 8


def test_cli_prints_only_the_token_on_stdout(tmp_path, capsys):
    path = tmp_path / "tokens.json"
    assert main(["token", "add", "--company", "acme", "--scope", "steps:read", "--scope", "deep:read",
                 "--tokens-file", str(path)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("sst_")
    token = out.strip()
    assert TokenRegistry(path).authenticate(token).scopes == {"steps:read", "deep:read"}
    assert main(["token", "list", "--tokens-file", str(path)]) == 0
    listing = capsys.readouterr().out
    token_id = token.split("_")[1]
    assert token_id in listing and token.split("_", 2)[2] not in listing and "steps:read,deep:read" in listing
    assert main(["token", "revoke", token_id, "--tokens-file", str(path)]) == 0
    assert TokenRegistry(path).authenticate(token) is None
    assert main(["token", "revoke", "ffffffffffff", "--tokens-file", str(path)]) == 1
    assert os.stat(path).st_mode & 0o077 == 0
