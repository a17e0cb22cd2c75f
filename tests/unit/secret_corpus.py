"""A generated corpus of credentials and of innocent look-alikes (issue 10).

Every credential is fake but has the real format (prefix, alphabet, length), drawn
from a seeded ``random.Random``, so the corpus is the same on every run.

* :func:`secret_cases`: at least 500 :class:`Case` s, every class of
  ``docs/redaction.md`` in several spellings, each in five contexts: bare, inside a
  URL, on a command line, as a JSON string inside a string, in a header block.
  ``secret`` is the part that must vanish from every operator surface.
* :func:`innocent_cases`: at least 500 strings that look like credentials but are
  not (UUIDs, git SHAs, content hashes, base64 images, prose and code about tokens
  and passwords, URLs without a password, token counts). Masked under 1%.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import string
import uuid
from typing import NamedTuple

import msgspec

ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
HEX = "0123456789abcdef"
URL_SAFE = ALNUM + "_-"


class Case(NamedTuple):
    kind: str
    context: str
    text: str
    secret: str


def _r(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choices(alphabet, k=n))


def _password(rng: random.Random) -> str:
    return _r(rng, ALNUM, rng.randint(3, 6)) + rng.choice("!%*+~") + _r(rng, ALNUM, rng.randint(4, 10))


def _jwt(rng: random.Random) -> str:
    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    header = part({"alg": rng.choice(["HS256", "RS256"]), "typ": "JWT"})
    payload = part({"sub": _r(rng, ALNUM, 10), "iat": rng.randint(1_600_000_000, 1_800_000_000)})
    return f"{header}.{payload}.{_r(rng, URL_SAFE, 43)}"


def _pem(rng: random.Random, label: str) -> str:
    body = "\n".join(_r(rng, ALNUM + "+/", 64) for _ in range(rng.randint(2, 5)))
    return f"-----BEGIN {label}-----\n{body}\n-----END {label}-----"


# Bare tokens: (kind, make) where make(rng) -> the token (all of it is secret).
def _tokens() -> list[tuple[str, object]]:
    return [
        ("openai_key", lambda g: "sk-proj-" + _r(g, URL_SAFE, 48)),
        ("openai_key_legacy", lambda g: "sk-" + _r(g, ALNUM, 48)),
        ("anthropic_key", lambda g: "sk-ant-api03-" + _r(g, URL_SAFE, 93) + "AA"),
        ("stripe_live", lambda g: "sk_live_" + _r(g, ALNUM, 24)),
        ("stripe_restricted", lambda g: "rk_live_" + _r(g, ALNUM, 24)),
        ("slack_bot", lambda g: f"xoxb-{_r(g, string.digits, 12)}-{_r(g, string.digits, 12)}-{_r(g, ALNUM, 24)}"),
        ("slack_user", lambda g: f"xoxp-{_r(g, string.digits, 12)}-{_r(g, string.digits, 12)}-{_r(g, HEX, 32)}"),
        ("sendgrid", lambda g: f"SG.{_r(g, URL_SAFE, 22)}.{_r(g, URL_SAFE, 43)}"),
        ("twilio_api_key", lambda g: "SK" + _r(g, HEX, 32)),
        ("github_pat_classic", lambda g: "ghp_" + _r(g, ALNUM, 36)),
        ("github_oauth", lambda g: "gho_" + _r(g, ALNUM, 36)),
        ("github_fine_grained", lambda g: "github_pat_" + _r(g, ALNUM, 22) + "_" + _r(g, ALNUM, 59)),
        ("gitlab", lambda g: "glpat-" + _r(g, URL_SAFE, 20)),
        ("npm", lambda g: "npm_" + _r(g, ALNUM, 36)),
        ("pypi", lambda g: "pypi-AgEIcHlwaS5vcmc" + _r(g, URL_SAFE, 70)),
        ("huggingface", lambda g: "hf_" + _r(g, string.ascii_letters, 34)),
        ("google_api_key", lambda g: "AIza" + _r(g, URL_SAFE, 35)),
        ("aws_access_key_id", lambda g: g.choice(["AKIA", "ASIA"]) + _r(g, UPPER_DIGITS, 16)),
        ("jwt", _jwt),
    ]


# Credentials that keep the sentence: (kind, make) where make(rng) -> (text, secret).
def _phrases() -> list[tuple[str, object]]:
    def url(scheme: str):
        def make(g):
            pw = _password(g)
            return f"{scheme}://{g.choice(['admin', 'app', 'svc_user'])}:{pw}@db{g.randint(1, 9)}.internal:5432/prod", pw

        return make

    def basic(g):
        cred = base64.b64encode(f"{_r(g, ALNUM, 6)}:{_password(g)}".encode()).decode()
        return f"Authorization: Basic {cred}", cred

    def bearer(g):
        tok = _r(g, URL_SAFE, 40)
        return f"{g.choice(['Authorization: Bearer', 'bearer', 'BEARER'])} {tok}", tok

    def token_scheme(g):
        tok = _r(g, HEX, 40)
        return f"Authorization: Token {tok}", tok

    def digest(g):
        resp = _r(g, HEX, 32)
        return f'Authorization: Digest username="ann", realm="api", nonce="{_r(g, HEX, 16)}", response="{resp}"', resp

    def aws_secret(g):
        key = _r(g, ALNUM + "+/", 40)
        return f"{g.choice(['aws_secret_access_key', 'AWS_SECRET_ACCESS_KEY'])}={key}", key

    def azure(g):
        key = base64.b64encode(g.randbytes(64)).decode()
        return f"DefaultEndpointsProtocol=https;AccountName=acct{g.randint(1, 99)};AccountKey={key};EndpointSuffix=core.windows.net", key

    def azure_sas(g):
        sig = base64.b64encode(g.randbytes(32)).decode().replace("+", "%2B").replace("/", "%2F").replace("=", "%3D")
        return f"https://acct.blob.core.windows.net/c/f.txt?sv=2022-11-02&sr=b&sig={sig}", sig

    def name_value(name: str, sep: str):
        def make(g):
            value = _password(g)
            return f"{name}{sep}{value}", value

        return make

    def flag(name: str):
        def make(g):
            value = _password(g)
            return f"--{name} {value}", value

        return make

    def quoted(name: str):
        def make(g):
            value = _password(g) + " " + _r(g, ALNUM, 5)
            return f'"{name}": "{value}"', value

        return make

    def pem(label):
        def make(g):
            block = _pem(g, label)
            return block, block.split("\n")[1]

        return make

    return [
        ("url_postgres", url("postgres")),
        ("url_mysql", url("mysql")),
        ("url_mongodb_srv", url("mongodb+srv")),
        ("url_redis", url("redis")),
        ("url_amqp", url("amqps")),
        ("url_https", url("https")),
        ("basic", basic),
        ("bearer", bearer),
        ("token_scheme", token_scheme),
        ("digest", digest),
        ("aws_secret_in_context", aws_secret),
        ("azure_account_key", azure),
        ("azure_sas", azure_sas),
        ("env_password", name_value("DB_PASSWORD", "=")),
        ("env_openai", name_value("OPENAI_API_KEY", "=")),
        ("yaml_secret", name_value("client_secret", ": ")),
        ("header_api_key", name_value("X-Api-Key", ": ")),
        ("header_auth", name_value("X-Auth", ": ")),
        ("pwd", name_value("pwd", "=")),
        ("pass", name_value("db.pass", "=")),
        ("query_token", name_value("access_token", "=")),
        ("flag_password", flag("password")),
        ("flag_token", flag("auth-token")),
        ("json_passphrase", quoted("passphrase")),
        ("json_pwd", quoted("pwd")),
        ("pem_rsa", pem("RSA PRIVATE KEY")),
        ("pem_pkcs8", pem("PRIVATE KEY")),
        ("pem_ec", pem("EC PRIVATE KEY")),
        ("openssh", pem("OPENSSH PRIVATE KEY")),
    ]


def _contexts(rng: random.Random, text: str) -> dict[str, str]:
    return {
        "bare": text,
        "url": f"https://hooks.example.com/v1/callback?note=1#{text}" if "\n" not in text else f"see {text}",
        "command": f"curl -s -X POST https://api.example.com/v2/items -H 'Content-Type: application/json' -d '{text}'",
        "json_in_string": json.dumps({"note": "deploy", "detail": text, "n": rng.randint(1, 99)}),
        "header_block": f"POST /v1/run HTTP/1.1\r\nHost: api.example.com\r\n{text}\r\nAccept: */*\r\n",
    }


def secret_cases(seed: int = 10, rounds: int = 3) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for _ in range(rounds):
        for kind, make in _tokens():
            token = make(rng)  # type: ignore[operator]
            for context, text in _contexts(rng, token).items():
                cases.append(Case(kind, context, text, token))
        for kind, make in _phrases():
            text, secret = make(rng)  # type: ignore[operator]
            for context, wrapped in _contexts(rng, text).items():
                # A JSON string inside a string escapes newlines and quotes: the secret
                # that must vanish is then its escaped spelling.
                shown = json.dumps(secret)[1:-1] if context == "json_in_string" else secret
                cases.append(Case(kind, context, wrapped, shown))
    return cases


_PROSE = (
    "Reset your password from the settings page; it must be at least 12 characters.",
    "The tokenizer splits text into tokens before the model sees it.",
    "We use Basic authentication only on the internal network.",
    "Rotate the API key every 90 days and never commit it.",
    "The session ended after 30 minutes of inactivity.",
    "A bearer of bad news is still welcome here.",
    "max_tokens=1024 temperature=0.2 top_p=0.9",
    "usage: prompt_tokens=812 completion_tokens=95 total_tokens=907",
    "The primary key of the ledger table is (company_id, entry_id).",
    "Pass the --verbose flag to see every step.",
    "The author's passport photo is on page 3.",
    "def get_token(self) -> str:\n    return self._token",
    "if key == 'region': continue",
    "See https://docs.example.com/auth/tokens#rotation for details.",
    "Token count: 4096 of 8192 used.",
    "compass: north-east; bypass: route 9",
    "The digest of the release is attached.",
    "email admin@example.com about the outage",
)


def innocent_cases(seed: int = 11, count: int = 600) -> list[str]:
    rng = random.Random(seed)
    makers = [
        lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        lambda: _r(rng, HEX, 40),  # a git SHA
        lambda: f"commit {_r(rng, HEX, 40)} (HEAD -> main)",
        lambda: hashlib.sha256(rng.randbytes(32)).hexdigest(),
        lambda: "sha256:" + hashlib.sha256(rng.randbytes(16)).hexdigest(),
        lambda: "data:image/png;base64," + base64.b64encode(rng.randbytes(rng.randint(60, 300))).decode(),
        lambda: base64.b64encode(rng.randbytes(48)).decode(),
        lambda: rng.choice(_PROSE),
        lambda: f"https://api.example.com/v1/items/{rng.randint(1, 10**6)}?page={rng.randint(1, 9)}",
        lambda: f"postgres://db{rng.randint(1, 9)}.internal:5432/prod",
        lambda: f"ssh://git@github.com/acme/widgets-{rng.randint(1, 99)}.git",
        lambda: f"s3://bucket-{rng.randint(1, 99)}/logs/2026/11/29/part-{rng.randint(0, 999):05d}.json",
        lambda: f"/srv/app/{_r(rng, string.ascii_lowercase, 8)}/task-{_r(rng, ALNUM, 24)}.log",
        lambda: f"max_tokens: {rng.randint(1, 8192)}",
        lambda: f"--max-new-tokens {rng.randint(1, 8192)}",
        lambda: f"request_id={_r(rng, ALNUM, 26)}",
        lambda: f"trace-id: {_r(rng, HEX, 32)}",
        lambda: f"scikit-learn==1.{rng.randint(0, 9)}.{rng.randint(0, 9)} sk-learn pipeline",
        lambda: f"{rng.choice(['Bearer', 'Basic', 'Token'])} auth is configured in config.yaml",
        lambda: f"region=eu-west-{rng.randint(1, 3)} zone=b cache_key={_r(rng, string.ascii_lowercase, 6)}",
        lambda: f"ETag: \"{_r(rng, HEX, 32)}\"",
        lambda: f"eyeball {_r(rng, string.ascii_lowercase, 10)} eyJ",
        lambda: f"AKIA is the prefix of an AWS access key id; {_r(rng, string.ascii_lowercase, 16)}",
        lambda: f"ghp_ tokens look like ghp_ followed by 36 characters",
        lambda: f"{rng.choice(['cached', 'reasoning', 'input'])}_tokens={rng.randint(0, 99999)}",
        lambda: f"2026-11-29T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z run {uuid.UUID(int=rng.getrandbits(128))}",
        lambda: f"SELECT id, password_hash IS NOT NULL AS has_password FROM users LIMIT {rng.randint(1, 99)}",
    ]
    return [rng.choice(makers)() for _ in range(count)]


def strings_of(value) -> list[str]:
    """Every string in ``value``, keys included (checked raw: JSON would escape them)."""
    out: list[str] = []
    stack = [msgspec.to_builtins(value)]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, dict):
            out.extend(k for k in node if isinstance(k, str))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out
