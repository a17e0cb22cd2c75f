"""A deterministic, realistic corpus of agent runs, for the demo, tests and benchmarks.

:func:`generate_events` returns wire events (``core.wire`` Structs, valid v1) of
many runs across several companies, interleaved like real traffic: a pool of
concurrently active runs, each emitting in its own ``seq`` order, one at a time
in random turns. The same arguments always give the same events.

What a run looks like: ``run_start``; a few turns of LLM calls (with usage),
thinking bursts (most events are small ``thinking_delta`` of 5-80 characters,
bursts of up to several hundred, with non-ASCII and emoji text), tool calls and
results (some failing, a few with outputs over 64k characters), state changes
and errors; then ``run_end`` (completed, or failed with a failure), or nothing at
all for a dead agent (sometimes mid-thinking).

Secrets: every secret the corpus plants contains :data:`CANARY` and sits where
redaction promises to mask it: under a sensitive key (``api_key``,
``Authorization``, ``password``, ``clientSecret``, ``session_token``, ...), or
in a credential-shaped value (``sk-...``, ``ghp_...``, ``Bearer ...``, a PEM
private key) under an innocent key. So no step may contain :data:`CANARY`,
while the deep companions keep every one.

``duplicates`` re-delivers that fraction of events a little later (same ``seq``
and ``event_id``); ``redeliveries`` re-inserts that many windows of recent events,
as a consumer restart would.

:func:`generate_many_runs` is the other shape: many agents, each ending its run and
starting the next, so a worker sees thousands of distinct short runs (a few events
each, always ``run_start`` to ``run_end``) and few events per run.
"""

from __future__ import annotations

import random
import string
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from stepstream.core import wire

__all__ = ["CANARY", "DEFAULT_START", "generate_events", "generate_many_runs"]

CANARY = "S3CR3T"
DEFAULT_START = datetime(2026, 11, 29, 9, 0, 0, tzinfo=timezone.utc)

_ALNUM = string.ascii_letters + string.digits
_WORDS = (
    "the", "invoice", "total", "looks", "doubled", "because", "retry", "charged", "twice", "so", "I",
    "should", "check", "ledger", "entries", "first", "then", "compare", "with", "the", "webhook", "log",
    "maybe", "timezone", "issue", "naïve", "café", "Größe", "déjà vu", "日本語", "テスト", "données",
    "ñandú", "Ωmega", "→", "—", "✓", "🙂", "🚀", "🤔", "👩‍💻", "🇪🇺", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\n", "“quoted”", "x²",
)  # fmt: skip
_AGENTS = ("support-bot", "billing-agent", "code-reviewer", "research-assistant", "ops-runbook", "data-cleaner")
_ENVS = ("prod", "staging", "dev", None)
_MODELS = (
    ("anthropic", "claude-sonnet-4"),
    ("openai", "gpt-4.1"),
    ("google", "gemini-2.5-pro"),
    ("mistral", "large-2"),
)
_ERRORS = (("timeout", "upstream timed out after 30s"), ("rate_limit", "429 Too Many Requests"),
           (None, "unexpected EOF while reading"), ("validation", "field 'amount' must be ≥ 0"))  # fmt: skip
_FAILURES = ("tool budget exhausted", "model refused to continue", "unhandled exception in planner")


class _Gen:
    """Random parts of a run, from one seeded ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def alnum(self, n: int) -> str:
        return "".join(self.rng.choices(_ALNUM, k=n))

    def secret(self, kind: str) -> str:
        a, b = self.alnum(16), self.alnum(10)
        if kind == "sk":
            return f"sk-proj-{a}{CANARY}{b}"
        if kind == "ghp":
            return f"ghp_{a}{CANARY}{b}{self.alnum(6)}"
        if kind == "bearer":
            return f"Bearer eyJ{a}{CANARY}.{b}"
        if kind == "pem":
            return (
                f"-----BEGIN RSA PRIVATE KEY-----\nMII{a}{CANARY}{b}\n{self.alnum(48)}\n-----END RSA PRIVATE KEY-----"
            )
        return f"pw-{a[:6]}{CANARY}{b[:4]}"

    def text(self, lo: int, hi: int) -> str:
        target = self.rng.randint(lo, hi)
        parts: list[str] = []
        size = 0
        while size <= target:
            word = self.rng.choice(_WORDS)
            parts.append(word)
            size += len(word) + 1
        return " ".join(parts)[:target] or "…"

    def burst(self) -> int:
        roll = self.rng.random()
        if roll < 0.70:
            return self.rng.randint(5, 40)
        if roll < 0.95:
            return self.rng.randint(40, 200)
        return self.rng.randint(200, 600)

    def tool_call(self, n: int) -> tuple[str, dict[str, Any]]:
        rng = self.rng
        pick = rng.randrange(8)
        if pick == 0:
            return "http.get", {
                "url": f"https://api.example.com/v1/items?page={n}",
                "headers": {"Authorization": self.secret("bearer"), "Accept": "application/json"},
            }
        if pick == 1:
            return "shell.exec", {
                "cmd": f"curl -H 'Authorization: {self.secret('bearer')}' https://x.test",
                "env": {"OPENAI_API_KEY": self.secret("sk"), "PATH": "/usr/bin"},
            }
        if pick == 2:
            return "db.query", {
                "sql": "SELECT * FROM ledger WHERE amount > 0 LIMIT 50",
                "connection": {"host": "db.internal", "user": "app", "password": self.secret("pw")},
            }
        if pick == 3:
            return "github.create_issue", {
                "repo": "acme/widgets",
                "title": self.text(10, 60),
                "note": f"token for CI: {self.secret('ghp')}",
            }
        if pick == 4:
            return "deploy.sign", {"target": rng.choice(["prod", "staging"]), "key_material": self.secret("pem")}
        if pick == 5:
            return "config.set", {
                "service": {
                    "auth": {
                        "clientSecret": self.secret("pw"),
                        "scopes": ["read", "write"],
                        "nested": [{"x-api-key": self.secret("sk")}, {"private_key": self.secret("pem")}],
                    }
                }
            }
        if pick == 6:
            return "search.web", {"query": self.text(8, 40), "top_k": rng.randint(3, 10)}
        return "fs.read", {"path": f"/srv/app/{self.alnum(6)}.log", "api_key": self.secret("sk")}

    def tool_output(self, large_rate: float) -> tuple[Any, bool]:
        rng = self.rng
        if rng.random() < 0.08:
            return {"error": self.text(10, 80), "code": rng.choice([400, 404, 500])}, True
        if rng.random() < large_rate:
            return self.text(70_000, 140_000), False
        pick = rng.randrange(3)
        if pick == 0:
            return [{"id": i, "name": self.text(3, 20)} for i in range(rng.randint(0, 15))], False
        if pick == 1:
            return {"status": "ok", "rows": rng.randint(0, 500), "summary": self.text(20, 200)}, False
        return self.text(20, 3000), False


def _script(g: _Gen, *, failure_rate: float, end_missing: float, large_rate: float, turns: int) -> Iterator[Any]:
    """The payloads of one run, in order (the interleaver wraps them in envelopes)."""
    rng = g.rng
    env = rng.choice(_ENVS)
    meta = {"ticket": f"T-{rng.randint(1000, 9999)}", "region": rng.choice(["eu-west-1", "us-east-1"])}
    yield wire.RunStartPayload(agent_name=rng.choice(_AGENTS), environment=env, metadata=meta)
    dies = rng.random() < end_missing
    last_turn = rng.randint(1, turns)
    for turn in range(last_turn):
        if rng.random() < 0.8:
            provider, model = rng.choice(_MODELS)
            params: dict[str, Any] = {"temperature": round(rng.random(), 2), "max_output": 2048}
            if rng.random() < 0.3:
                params["api_key"] = g.secret("sk")
            messages = [{"role": "user", "content": g.text(10, 300)}]
            yield wire.LlmRequestPayload(
                call_id=f"llm-{turn}", provider=provider, model=model, input=messages, params=params
            )
        for _ in range(g.burst()):
            yield wire.ThinkingDeltaPayload(text=g.text(5, 80))
        if dies and turn == last_turn - 1 and rng.random() < 0.5:
            return  # died mid-thinking
        if rng.random() < 0.8:
            usage = wire.Usage(
                input_tokens=rng.randint(50, 4000),
                output_tokens=rng.randint(10, 900),
                reasoning_tokens=rng.randint(0, 2000),
            )
            output = {"role": "assistant", "content": g.text(10, 400)}
            yield wire.LlmResponsePayload(call_id=f"llm-{turn}", output=output, usage=usage, stop_reason="tool_use")
        for k in range(rng.randint(0, 3)):
            tool, args = g.tool_call(k)
            call_id = f"call-{turn}-{k}"
            yield wire.ToolCallPayload(call_id=call_id, tool=tool, arguments=args)
            if rng.random() < 0.3:
                for _ in range(rng.randint(1, 20)):
                    yield wire.ThinkingDeltaPayload(text=g.text(5, 80))
            output, is_error = g.tool_output(large_rate)
            yield wire.ToolResultPayload(call_id=call_id, output=output, is_error=is_error)
        if rng.random() < 0.3:
            key, value = rng.choice(
                [
                    ("plan", [g.text(5, 30) for _ in range(3)]),
                    ("cursor", rng.randint(0, 99)),
                    ("session_token", g.secret("pw")),
                    ("memory.summary", g.text(20, 200)),
                ]
            )
            yield wire.StateChangePayload(key=key, value=value)
        if rng.random() < 0.1:
            kind, message = rng.choice(_ERRORS)
            if rng.random() < 0.3:
                message += f" (sent {g.secret('bearer')})"
            yield wire.ErrorPayload(message=message, kind=kind)
    if dies:
        return
    if rng.random() < failure_rate:
        failure = rng.choice(_FAILURES)
        yield wire.RunEndPayload(status="failed", failure=failure)
    else:
        yield wire.RunEndPayload(status="completed")


_EVENT_OF = {
    wire.RunStartPayload: wire.RunStart, wire.LlmRequestPayload: wire.LlmRequest,
    wire.LlmResponsePayload: wire.LlmResponse, wire.ThinkingDeltaPayload: wire.ThinkingDelta,
    wire.ToolCallPayload: wire.ToolCall, wire.ToolResultPayload: wire.ToolResult,
    wire.StateChangePayload: wire.StateChange, wire.ErrorPayload: wire.Error, wire.RunEndPayload: wire.RunEnd,
}  # fmt: skip


def generate_events(
    seed: int,
    runs: int = 50,
    companies: int = 3,
    *,
    concurrency: int = 12,
    turns: int = 6,
    failure_rate: float = 0.15,
    end_missing: float = 0.08,
    large_output_rate: float = 0.03,
    duplicates: float = 0.0,
    redeliveries: int = 0,
    start: datetime = DEFAULT_START,
) -> list[wire.Event]:
    """``runs`` runs spread over ``companies`` companies (each company gets at
    least one run when ``runs >= companies``), interleaved ``concurrency`` at a
    time; see the module docstring."""
    rng = random.Random(seed)
    g = _Gen(rng)
    company_ids = [f"co-{i:02d}" for i in range(companies)]
    pending = list(range(runs))
    active: list[list[Any]] = []  # [company, run_id, script, next_seq]
    clock = start
    out: list[wire.Event] = []
    while pending or active:
        while pending and len(active) < concurrency:
            i = pending.pop(0)
            company = company_ids[i % companies]
            run_id = f"run-{seed % 100000}.{i:05d}:{g.alnum(6)}"
            script = _script(
                g, failure_rate=failure_rate, end_missing=end_missing, large_rate=large_output_rate, turns=turns
            )
            active.append([company, run_id, script, 0])
        slot = active[rng.randrange(len(active))]
        payload = next(slot[2], None)
        if payload is None:
            active.remove(slot)
            continue
        clock += timedelta(microseconds=rng.randint(50, 20_000))
        event_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        cls = _EVENT_OF[type(payload)]
        out.append(
            cls(v=1, event_id=event_id, company_id=slot[0], run_id=slot[1], seq=slot[3], ts=clock, payload=payload)
        )
        slot[3] += 1
    if duplicates > 0:
        out = _sprinkle(rng, out, duplicates)
    for _ in range(redeliveries):
        at = rng.randrange(len(out) + 1)
        size = rng.randint(1, 200)
        out[at:at] = out[max(0, at - size) : at]
    return out


def _sprinkle(rng: random.Random, events: list[wire.Event], rate: float) -> list[wire.Event]:
    later: dict[int, list[wire.Event]] = {}
    out: list[wire.Event] = []
    for i, event in enumerate(events):
        out.extend(later.pop(i, ()))
        out.append(event)
        if rng.random() < rate:
            later.setdefault(i + rng.randint(1, 50), []).append(event)
    for i in sorted(later):
        out.extend(later[i])
    return out


def _short_script(g: _Gen, *, failure_rate: float) -> Iterator[Any]:
    """The payloads of one short run: start, one LLM call with a short thinking burst
    (85% of runs, 1-8 deltas), at most one tool call with a list output, end."""
    rng = g.rng
    yield wire.RunStartPayload(agent_name=rng.choice(_AGENTS), environment=rng.choice(_ENVS))
    provider, model = rng.choice(_MODELS)
    messages = [{"role": "user", "content": g.text(10, 120)}]
    yield wire.LlmRequestPayload(call_id="llm-0", provider=provider, model=model, input=messages, params={})
    if rng.random() < 0.85:
        for _ in range(rng.randint(1, 8)):
            yield wire.ThinkingDeltaPayload(text=g.text(5, 80))
    usage = wire.Usage(input_tokens=rng.randint(50, 2000), output_tokens=rng.randint(10, 400))
    output = {"role": "assistant", "content": g.text(10, 200)}
    yield wire.LlmResponsePayload(call_id="llm-0", output=output, usage=usage, stop_reason="tool_use")
    if rng.random() < 0.7:
        tool, arguments = g.tool_call(0)
        yield wire.ToolCallPayload(call_id="call-0", tool=tool, arguments=arguments)
        rows = [{"id": i, "name": g.text(3, 20)} for i in range(rng.randint(1, 12))]
        yield wire.ToolResultPayload(call_id="call-0", output=rows, is_error=False)
    if rng.random() < failure_rate:
        yield wire.RunEndPayload(status="failed", failure=rng.choice(_FAILURES))
    else:
        yield wire.RunEndPayload(status="completed")


def generate_many_runs(
    seed: int,
    runs: int = 16_000,
    companies: int = 8,
    *,
    agents: int = 400,
    failure_rate: float = 0.1,
    start: datetime = DEFAULT_START,
) -> list[wire.Event]:
    """``runs`` distinct short runs (about 9 events each) over ``companies``
    companies, from ``agents`` agents emitting at once: when an agent's run ends it
    starts the next, so runs keep ending and starting for the whole corpus. Events
    are interleaved as in :func:`generate_events`; run ids are unique; the same
    arguments always give the same events."""
    rng = random.Random(seed)
    g = _Gen(rng)
    company_ids = [f"co-{i:02d}" for i in range(companies)]
    started = 0
    active: list[list[Any]] = []  # [company, run_id, script, next_seq]
    clock = start
    out: list[wire.Event] = []
    while started < runs or active:
        while started < runs and len(active) < agents:
            run_id = f"short-{seed % 100000}.{started:06d}:{g.alnum(6)}"
            active.append([company_ids[started % companies], run_id, _short_script(g, failure_rate=failure_rate), 0])
            started += 1
        slot = active[rng.randrange(len(active))]
        payload = next(slot[2], None)
        if payload is None:
            active.remove(slot)
            continue
        clock += timedelta(microseconds=rng.randint(10, 2_000))
        event_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        cls = _EVENT_OF[type(payload)]
        out.append(
            cls(v=1, event_id=event_id, company_id=slot[0], run_id=slot[1], seq=slot[3], ts=clock, payload=payload)
        )
        slot[3] += 1
    return out
