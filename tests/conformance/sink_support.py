"""Record builders for the sink conformance suite."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord

MONGO_ENV = "STEPSTREAM_TEST_MONGO_URL"
COMPANY = "acme"
OTHER = "globex"


def ts(n: int) -> str:
    """The n-th timestamp, RFC 3339 UTC with microseconds (sorts as text)."""
    return f"2025-01-01T00:{n // 60 % 60:02d}:{n % 60:02d}.{n:06d}Z"


def step(seq: int, run: str = "r1", company: str = COMPANY, **fields: Any) -> StepRecord:
    fields.setdefault("kind", "tool")
    return StepRecord(company_id=company, run_id=run, step_seq=seq, **fields)


def deep(seq: int, run: str = "r1", company: str = COMPANY, at: int = 0, **fields: Any) -> DeepRecord:
    fields.setdefault("kind", "tool")
    return DeepRecord(company_id=company, run_id=run, step_seq=seq, ts=ts(at), **fields)


def run(run_id: str = "r1", company: str = COMPANY, **fields: Any) -> RunRecord:
    return RunRecord(company_id=company, run_id=run_id, **fields)


def state(run_id: str = "r1", company: str = COMPANY, **fields: Any) -> RunState:
    return RunState(company_id=company, run_id=run_id, **fields)


# Text that exercises every encoding path: multi-byte, astral (surrogate pairs in
# UTF-16, 4 bytes in UTF-8), combining marks, RTL, NUL and U+10FFFF.
UNICODE = (
    "héllo wörld — 日本語 \U0001f600\U0001f9d1\u200d\U0001f4bb e\u0301 \u05e9\u05dc\u05d5\u05dd \x00 \U0010ffff end"
)


def mongo_url(base: str, database: str) -> str:
    """``base`` (``mongodb://host:port/...``) pointing at ``database``."""
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, ""))


async def drop_database(url: str) -> None:
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient = AsyncMongoClient(url)
    try:
        await client.drop_database(client.get_default_database())
    finally:
        await client.close()


async def is_ferretdb(url: str) -> bool:
    """Whether the server at ``url`` is FerretDB (its ``buildInfo`` says so)."""
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient = AsyncMongoClient(url)
    try:
        return "ferretdbVersion" in await client.admin.command("buildInfo")
    finally:
        await client.close()
