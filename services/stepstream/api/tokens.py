"""API tokens: the tokens file, the ``stepstream token`` commands and the check the API makes.

A token reads ``sst_<id>_<secret>``: ``id`` is 12 hex digits (public: listed,
logged, used to revoke), ``secret`` is 32 random bytes in URL-safe base64. The
tokens file never holds a secret: each entry keeps a random 16-byte salt and
``HMAC-SHA256(key=salt, secret)``. The secret has 256 bits of entropy, so a
fast keyed digest is enough (there is nothing to brute-force); the salt makes
two files' digests of one secret unrelated.

**File.** JSON, ``{"version": 1, "tokens": [...]}``. Every change is a
read-modify-write under an exclusive lock (``<file>.lock``), written to a
temporary file in the same directory (mode ``0600``), fsynced, then renamed over
the old one, so a reader sees the old file or the new one, never half of one.

**Reading.** :class:`TokenRegistry` re-reads the file when its ``stat``
(inode, size, mtime) changes, checked on every request, so ``token revoke``
takes effect on the next request without a restart. A missing file means no
token is valid (every request is 401). A file that exists but cannot be read or
parsed raises :class:`TokensUnavailable`: the API fails closed (503) instead of
serving from a stale copy that may still hold a revoked token.

**Comparison.** The digest is compared with :func:`hmac.compare_digest`; an
unknown id is compared against a dummy entry, so timing says nothing about
which ids exist.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import logging
import os
import re
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import msgspec

from stepstream.core.wire import CompanyId
from stepstream.errors import AuthError, ConfigError

__all__ = [
    "COMPANY_PATTERN",
    "SCOPES",
    "Principal",
    "Scope",
    "TokenEntry",
    "TokenRegistry",
    "TokensUnavailable",
    "add_token",
    "list_tokens",
    "revoke_token",
]

log = logging.getLogger("stepstream.api.tokens")

Scope = Literal["steps:read", "deep:read", "deep:purge", "ingest"]
# ``ingest``: write wire events of the token's company (``POST .../events``, api/ingest.py).
SCOPES: tuple[str, ...] = ("steps:read", "deep:read", "deep:purge", "ingest")
COMPANY_PATTERN: str = CompanyId.__metadata__[0].pattern  # the wire contract's company id
_COMPANY = re.compile(COMPANY_PATTERN)
_TOKEN = re.compile(r"^sst_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
PREFIX = "sst_"


class TokenEntry(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One stored token: never the secret, only its salted keyed digest."""

    id: str
    company: str
    scopes: list[str]
    created: str
    salt: str  # hex
    digest: str  # hex HMAC-SHA256(salt, secret)
    revoked: str | None = None


class TokensFile(msgspec.Struct, kw_only=True):
    version: int = 1
    tokens: list[TokenEntry] = []


class Principal(msgspec.Struct, frozen=True):
    """Who a valid token speaks for."""

    token_id: str
    company: str
    scopes: frozenset[str]


class TokensUnavailable(AuthError):
    """The tokens file exists but cannot be read or parsed (the API answers 503)."""

    retriable = True


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(TokensFile)


def _digest(salt: bytes, secret: str) -> bytes:
    return hmac.new(salt, secret.encode("ascii"), hashlib.sha256).digest()


def _read(path: Path) -> TokensFile:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return TokensFile()
    except OSError as exc:
        raise TokensUnavailable(f"tokens file {path} cannot be read ({type(exc).__name__})") from None
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise TokensUnavailable(f"tokens file {path} is not a valid tokens file: {exc}") from None


def _write(path: Path, content: TokensFile) -> None:
    directory = path.parent
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(_encoder.encode(content) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialize read-modify-write of the tokens file across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def add_token(path: Path, company: str, scopes: list[str], *, created: str) -> tuple[str, TokenEntry]:
    """Create a token for ``company`` with ``scopes``; returns ``(token, entry)``.
    The token exists only in the return value: the file keeps its digest."""
    if not _COMPANY.fullmatch(company):
        raise ConfigError("company must match [A-Za-z0-9._-]{1,64}")
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise ConfigError(f"scopes must be one or more of {', '.join(SCOPES)}")
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii").rstrip("=")
    salt = secrets.token_bytes(16)
    with _locked(path):
        content = _read(path)
        taken = {t.id for t in content.tokens}
        token_id = secrets.token_hex(6)
        while token_id in taken:
            token_id = secrets.token_hex(6)
        entry = TokenEntry(
            id=token_id,
            company=company,
            scopes=sorted(set(scopes), key=SCOPES.index),
            created=created,
            salt=salt.hex(),
            digest=_digest(salt, secret).hex(),
        )
        content.tokens.append(entry)
        _write(path, content)
    return f"{PREFIX}{token_id}_{secret}", entry


def list_tokens(path: Path) -> list[TokenEntry]:
    """Every entry, revoked ones included (``revoked`` set), in creation order."""
    return list(_read(path).tokens)


def revoke_token(path: Path, token_id: str, *, revoked: str) -> bool:
    """Mark ``token_id`` revoked; ``False`` when no such token (or already revoked)."""
    with _locked(path):
        content = _read(path)
        for entry in content.tokens:
            if entry.id == token_id and entry.revoked is None:
                entry.revoked = revoked
                _write(path, content)
                return True
    return False


_DUMMY_SALT = bytes(16)
_DUMMY_DIGEST = _digest(_DUMMY_SALT, "x" * 43)


class TokenRegistry:
    """The API's view of the tokens file, re-read whenever the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._signature: tuple[int, int, int] | None = None
        self._by_id: dict[str, tuple[bytes, bytes, Principal]] = {}
        self._missing_logged = False

    def _refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if not self._missing_logged:
                log.warning("tokens file %s does not exist: every request is 401", self.path)
                self._missing_logged = True
            self._signature, self._by_id = None, {}
            return
        except OSError as exc:
            raise TokensUnavailable(f"tokens file {self.path} cannot be read ({type(exc).__name__})") from None
        signature = (st.st_ino, st.st_size, st.st_mtime_ns)
        if signature == self._signature:
            return
        content = _read(self.path)
        by_id = {}
        for entry in content.tokens:
            if entry.revoked is not None:
                continue
            try:
                salt, digest = bytes.fromhex(entry.salt), bytes.fromhex(entry.digest)
            except ValueError:
                raise TokensUnavailable(f"tokens file {self.path}: entry {entry.id} is malformed") from None
            by_id[entry.id] = (salt, digest, Principal(entry.id, entry.company, frozenset(entry.scopes)))
        self._by_id, self._signature, self._missing_logged = by_id, signature, False
        log.info("tokens file %s loaded: %d active tokens", self.path, len(by_id))

    def authenticate(self, token: str) -> Principal | None:
        """The principal of a valid, unrevoked token; ``None`` otherwise.
        Raises :class:`TokensUnavailable` when the file is unreadable."""
        self._refresh()
        match = _TOKEN.fullmatch(token)
        token_id, secret = match.groups() if match else ("", "x" * 43)
        salt, digest, principal = self._by_id.get(token_id, (_DUMMY_SALT, _DUMMY_DIGEST, None))
        same = hmac.compare_digest(_digest(salt, secret), digest)
        return principal if same and principal is not None else None
