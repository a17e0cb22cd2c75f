"""Redaction benchmark: the second line (credential formats, ``core.credentials``) on
hostile and on ordinary input.

    PYTHONPATH=services python -m benchmarks.bench_redact [--quick] [--rounds 5]

* **Near-match budget** (a check, not a timing of a test): for each family of rules, a
  1 MiB string made of near-matches (``sk-`` too short, ``eyJ`` without its dots, a
  URL with a user but no ``@``, ``Bearer`` with a short word, a PEM header that is not
  a private key, ``bypass=``, ...) is masked and timed against a *plain scan*: one pass
  of Python ``re`` over every character (``[\\x00-\\x08]``, which never matches). The
  budget is :data:`BUDGET_SCANS` plain scans for the worst family; the run exits
  non-zero above it. Nothing in a near-match string may be masked.
* **Engine evaluation**: the same rules compiled with Python's ``re`` and run the same
  way, on a 64 KiB slice of each near-match string (1 MiB takes minutes there), beside
  RE2 on the same slice: why the engine is RE2.
* **Engine cost**: decode + fold events/s with the second line on against off (off:
  ``core.redact`` with the key rule only), on the thinking-heavy corpus of
  ``emitter.corpus`` and on a tool-heavy one (runs of tool calls and results with
  realistic arguments); the difference per tool call, and ``redact()`` alone per tool
  call's arguments, in microseconds.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import random
import re
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Iterator

from stepstream.core import credentials, wire
from stepstream.core.fold import RunFold
from stepstream.core.wire import decode_event, encode_event
from stepstream.emitter.corpus import DEFAULT_START, _Gen, generate_events

# stepstream.core re-exports the function redact(), which hides the module's name there.
redact_module = importlib.import_module("stepstream.core.redact")

Report = Callable[[str, float, str], None]

BUDGET_SCANS = 4.0
MIB = 1 << 20

# Near-matches per family: each piece almost matches a rule and must stay visible.
NEAR_MATCHES: dict[str, list[str]] = {
    "prefix_tokens": ["sk-abc ", "ghp_short ", "glpat-x ", "xoxb ", "AIza12 ", "hf_abc ", "npm_x ", "sk_live_1 "],
    "jwt": ["eyJhbGciOiJIUzI1NiJ9 ", "eyJeyJeyJ. ", "eyJabcde.eyJ "],
    "aws": ["AKIA123 ", "AKIAabcdefghijklmnop ", "ASIA" + "Z" * 15 + " "],
    "url": ["postgres://admin:secret ", "https://user@host/ ", "a://b:c/d@ ", "x:// "],
    "auth_schemes": ["Bearer short ", "Basic authentication ", "Token count ", "Digest username=ann "],
    "private_key": ["-----BEGIN PUBLIC KEY----- ", "-----BEGIN RSA PRIVATE ", "-----END PRIVATE KEY----- "],
    "name_value": ["bypass=1 ", "compass: north ", "author=ann ", "passage: x ", "tokenizer=bpe ", "keyboard=us "],
    "letters": ["abcdefghijklmnopqrstuvwxyz"],
    "mixed": [],  # every piece above, interleaved
}
NEAR_MATCHES["mixed"] = [piece for pieces in NEAR_MATCHES.values() for piece in pieces]


def near_match_string(family: str, size: int, seed: int = 5) -> str:
    rng = random.Random(seed)
    pieces = NEAR_MATCHES[family]
    out: list[str] = []
    total = 0
    while total < size:
        piece = rng.choice(pieces)
        out.append(piece)
        total += len(piece)
    return "".join(out)[:size]


def _best(fn: Callable[[], Any], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


_PLAIN = re.compile(r"[\x00-\x08]")


def near_match_budget(report: Report, *, size: int, rounds: int) -> bool:
    worst = 0.0
    for family in NEAR_MATCHES:
        text = near_match_string(family, size)
        masked = credentials.mask_text(text, "[redacted]")[0]
        assert masked == text, f"a near-match of {family} was masked"
        plain = _best(lambda: _PLAIN.search(text), rounds)
        took = _best(lambda: credentials.mask_text(text, "[redacted]"), rounds)
        scans = took / plain
        worst = max(worst, scans)
        report(f"near_match.{family}.mask", 1e3 * took, f"ms per {size // 1024} KiB ({scans:.2f} plain scans)")
    mixed = near_match_string("mixed", size)
    report("near_match.plain_scan", 1e3 * _best(lambda: _PLAIN.search(mixed), rounds), f"ms per {size // 1024} KiB")
    ok = worst <= BUDGET_SCANS
    report("near_match.worst_in_plain_scans", worst, f"(budget {BUDGET_SCANS:g}: {'ok' if ok else 'OVER BUDGET'})")
    # Not near-matches: whole strings of matches, and of candidates the key rule refuses
    # (token counts). Bounded by MAX_MATCHES per string, then masked fail-closed.
    for name, piece in (("all_matches", "sk-abcdefghijklmnopqrstuv "), ("all_count_candidates", "max_tokens=1024 ")):
        text = (piece * (size // len(piece) + 1))[:size]
        took = _best(lambda: credentials.mask_text(text, "[redacted]"), rounds)
        plain = _best(lambda: _PLAIN.search(text), rounds)
        report(f"{name}.mask", 1e3 * took, f"ms per {size // 1024} KiB ({took / plain:.2f} plain scans)")
    single = "x " * 50 + "max_tokens=1024 " + "y " * 50
    per = _best(lambda: [credentials.mask_text(single, "[redacted]") for _ in range(1000)], rounds) / 1000
    innocent = single.replace("max_tokens", "max_output")
    plain_short = _best(lambda: [credentials.mask_text(innocent, "[redacted]") for _ in range(1000)], rounds) / 1000
    report("cost_per_match", 1e6 * (per - plain_short), "us (one refused candidate in a 216-character string)")
    return ok


def _python_re_spans(regexes: list[re.Pattern[bytes]], data: bytes) -> int:
    """What Python's re would have to do without RE2's set: run every rule over the text."""
    found = 0
    for regex in regexes:
        pos = 0
        while pos < len(data):
            match = regex.search(data, pos)
            if match is None:
                break
            found += 1
            pos = max(match.end() - 1, match.start() + 1)
    return found


def engine_evaluation(report: Report, *, size: int, rounds: int) -> None:
    regexes = [re.compile(rule.pattern.encode()) for rule in credentials.RULES]
    for family in ("prefix_tokens", "url", "name_value", "letters", "mixed"):
        data = near_match_string(family, size).encode()
        re2_took = _best(lambda: credentials.find_secrets(data), rounds)
        re_took = _best(lambda: _python_re_spans(regexes, data), 1)
        report(f"engine.{family}.re2", 1e3 * re2_took, f"ms per {size // 1024} KiB")
        report(f"engine.{family}.python_re", 1e3 * re_took, f"ms per {size // 1024} KiB ({re_took / re2_took:.0f}x RE2)")


@contextmanager
def second_line_off() -> Iterator[None]:
    """``core.redact`` with the key rule only: every string and key left as it is."""
    saved = redact_module.mask_text
    redact_module.mask_text = lambda text, replacement: (text, ())  # type: ignore[assignment]
    redact_module._mask_key.cache_clear()
    redact_module._scrub_short.cache_clear()
    try:
        yield
    finally:
        redact_module.mask_text = saved
        redact_module._mask_key.cache_clear()
        redact_module._scrub_short.cache_clear()


def tool_heavy_events(seed: int, runs: int, calls: int) -> list[wire.Event]:
    rng = random.Random(seed)
    gen = _Gen(rng)
    events: list[wire.Event] = []
    ts = DEFAULT_START
    for r in range(runs):
        payloads: list[Any] = [wire.RunStartPayload(agent_name="ops-runbook", environment="prod")]
        for k in range(calls):
            tool, arguments = gen.tool_call(k)
            payloads.append(wire.ToolCallPayload(call_id=f"c{k}", tool=tool, arguments=arguments))
            output, is_error = gen.tool_output(0.0)
            payloads.append(wire.ToolResultPayload(call_id=f"c{k}", output=output, is_error=is_error))
        payloads.append(wire.RunEndPayload(status="completed"))
        for seq, payload in enumerate(payloads):
            ts += timedelta(microseconds=500)
            cls = {wire.RunStartPayload: wire.RunStart, wire.ToolCallPayload: wire.ToolCall,
                   wire.ToolResultPayload: wire.ToolResult, wire.RunEndPayload: wire.RunEnd}[type(payload)]  # fmt: skip
            events.append(cls(v=1, event_id=f"{r}-{seq}", company_id="co", run_id=f"run-{r}", seq=seq, ts=ts,
                              payload=payload))  # fmt: skip
    return events


def _fold_all(blobs: list[bytes]) -> float:
    folds: dict[tuple[str, str], RunFold] = {}
    started = time.perf_counter()
    for i, blob in enumerate(blobs):
        event = decode_event(blob)
        key = (event.company_id, event.run_id)
        fold = folds.get(key)
        if fold is None:
            fold = folds[key] = RunFold(key[0], key[1])
        fold.push(event, i * 1e-4)
    for fold in folds.values():
        fold.flush()
    return time.perf_counter() - started


def engine_cost(report: Report, *, name: str, events: list[wire.Event], rounds: int) -> None:
    blobs = [encode_event(e) for e in events]
    calls = [e for e in events if type(e) is wire.ToolCall]
    gc.collect()
    on = off = float("inf")
    for _ in range(rounds):  # interleaved, best of each
        on = min(on, _fold_all(blobs))
        with second_line_off():
            off = min(off, _fold_all(blobs))
    n = len(blobs)
    report(f"{name}.events", n, f"({len(calls)} tool calls)")
    report(f"{name}.events_per_s.second_line_on", n / on, "events/s")
    report(f"{name}.events_per_s.second_line_off", n / off, "events/s")
    report(f"{name}.ratio_on_to_off", on / off, "x time")
    if calls:
        report(f"{name}.cost_per_tool_call", 1e6 * (on - off) / len(calls), "us (engine, on - off, all events' share)")
        arguments = [c.payload.arguments for c in calls]
        redact_on = _best(lambda: [redact_module.redact(a) for a in arguments], rounds)
        with second_line_off():
            redact_off = _best(lambda: [redact_module.redact(a) for a in arguments], rounds)
        report(f"{name}.redact_per_tool_call.on", 1e6 * redact_on / len(calls), "us")
        report(f"{name}.redact_per_tool_call.off", 1e6 * redact_off / len(calls), "us")


def run(report: Report, *, quick: bool, rounds: int) -> bool:
    ok = near_match_budget(report, size=MIB, rounds=rounds)
    engine_evaluation(report, size=(16 if quick else 64) * 1024, rounds=rounds)
    thinking = generate_events(7, runs=60 if quick else 400, companies=5)
    engine_cost(report, name="thinking_heavy", events=thinking, rounds=rounds)
    tools = tool_heavy_events(7, runs=40 if quick else 200, calls=20)
    engine_cost(report, name="tool_heavy", events=tools, rounds=rounds)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_redact", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller corpora, for a smoke run")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds, best kept [5]")
    args = parser.parse_args(argv)

    def report(name: str, value: float, unit: str) -> None:
        shown = f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"
        print(f"redact.{name:<48} {shown:>12} {unit}", flush=True)

    print(f"# stepstream redaction benchmark (Python {sys.version.split()[0]}, RE2 second line)")
    ok = run(report, quick=args.quick, rounds=2 if args.quick else args.rounds)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
