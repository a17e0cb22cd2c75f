"""Shared by the API tests: a corpus with canary secrets for two companies that
share run ids, loaded through the real engine, a tokens file, an in-process client."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import msgspec

from stepstream.api.app import ApiApp, create_app
from stepstream.api.tokens import TokenRegistry, add_token, revoke_token
from stepstream.core.wire import decode_event
from stepstream.metrics import ApiMetrics
from stepstream.pipeline import Pipeline
from stepstream.sinks.ports import DeepStore, StepStore

T0 = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)
COMPANIES = ("acme", "globex")
SHARED_RUNS = ("run-1", "run-2")  # both companies use these ids


def canaries(company: str, run_id: str) -> dict[str, str]:
    """Secrets that only the deep route may ever return (to a deep:read token)."""
    tag = f"{company}{run_id}".replace("-", "").replace(".", "").replace(":", "")
    return {
        "argument": f"CANARYarg{tag}",  # under a sensitive key of tool arguments
        "argument_value": f"sk-CANARYargval{tag}0123456789",  # a credential under a plain key
        "output": f"CANARYout{tag}",  # tool output (raw output is never on a step)
        "llm_input": f"CANARYllmin{tag}",
        "llm_output": f"CANARYllmout{tag}",
        "thinking": f"CANARYthink{tag}",  # reasoning text (never on a step)
        "state": f"CANARYstate{tag}",  # a state value under a sensitive key
        "error": f"sk-CANARYerr{tag}0123456789",  # a credential quoted in an error message
    }


def run_events(company: str, run_id: str, start: datetime) -> list[dict[str, Any]]:
    c = canaries(company, run_id)
    payloads: list[tuple[str, dict[str, Any]]] = [
        ("run_start", {"agent_name": f"agent-{company}", "environment": "prod"}),
        ("thinking_delta", {"text": f"let me think {c['thinking']} "}),
        ("thinking_delta", {"text": "and then some more"}),
        ("tool_call", {"call_id": "t1", "tool": "search",
                       "arguments": {"query": f"visible {company}", "api_key": c["argument"],
                                     "note": c["argument_value"]}}),
        ("tool_result", {"call_id": "t1", "output": {"hits": [c["output"], "x"]}}),
        ("state_change", {"key": "session_token", "value": c["state"]}),
        ("llm_request", {"call_id": "l1", "provider": "openai", "model": "gpt", "input": [c["llm_input"]],
                         "params": {"max_tokens": 64}}),
        ("llm_response", {"call_id": "l1", "output": c["llm_output"],
                          "usage": {"input_tokens": 3, "output_tokens": 5}}),
        ("error", {"message": f"upstream refused key {c['error']}", "kind": "http"}),
        ("run_end", {"status": "completed"}),
    ]  # fmt: skip
    return [
        {
            "v": 1,
            "event_id": f"{company}/{run_id}/{seq}",
            "company_id": company,
            "run_id": run_id,
            "seq": seq,
            "ts": (start + timedelta(seconds=seq)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "type": kind,
            "payload": payload,
        }
        for seq, (kind, payload) in enumerate(payloads)
    ]


def corpus(runs_per_company: int = 4) -> list[dict[str, Any]]:
    """Every company gets the shared run ids plus its own; runs start a minute apart."""
    events = []
    for ci, company in enumerate(COMPANIES):
        run_ids = [*SHARED_RUNS, *(f"{company}-only-{i}" for i in range(runs_per_company - len(SHARED_RUNS)))]
        for ri, run_id in enumerate(run_ids):
            events += run_events(company, run_id, T0 + timedelta(minutes=ri, seconds=ci * 7))
    return events


def write_jsonl(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(msgspec.json.encode(e) + b"\n" for e in events))
    return path


async def load(steps: StepStore, deep: DeepStore, events: list[dict[str, Any]]) -> None:
    """Fold ``events`` through the real pipeline into the stores."""
    pipeline = Pipeline(steps, deep, batch_records=5000, batch_seconds=3600)
    for event in events:
        await pipeline.push(decode_event(msgspec.json.encode(event)))
    await pipeline.drain()


class Tokens:
    """Per company: ``steps``, ``deep``, ``purge``, ``all`` and a ``revoked`` token
    (all scopes); ``bad`` is well-formed but was never issued."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.by: dict[tuple[str, str], str] = {}
        scopes = {
            "steps": ["steps:read"],
            "deep": ["deep:read"],
            "purge": ["deep:purge"],
            "all": ["steps:read", "deep:read", "deep:purge"],
            "revoked": ["steps:read", "deep:read", "deep:purge"],
        }
        for company in COMPANIES:
            for name, wanted in scopes.items():
                token, entry = add_token(path, company, wanted, created="2026-11-29T12:00:00Z")
                self.by[(company, name)] = token
                if name == "revoked":
                    revoke_token(path, entry.id, revoked="2026-11-29T12:00:01Z")
        self.bad = "sst_0123456789ab_" + "A" * 43

    def __getitem__(self, key: tuple[str, str]) -> str:
        return self.by[key]


def make_app(steps: StepStore, deep: DeepStore, tokens_path: Path) -> ApiApp:
    return create_app(steps, deep, TokenRegistry(tokens_path), ApiMetrics())


def client(app: ApiApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api.test")


def bearer(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def all_canaries(companies: Iterator[str] | tuple[str, ...] = COMPANIES, runs_per_company: int = 4) -> dict[str, str]:
    found = {}
    for event in corpus(runs_per_company):
        if event["company_id"] in companies:
            found.update({v: event["company_id"] for v in canaries(event["company_id"], event["run_id"]).values()})
    return found
