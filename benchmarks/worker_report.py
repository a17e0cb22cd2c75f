"""The worker benchmark's report: the table printed at the end of ``bench_worker``,
rendered from the same dict as its ``BENCH_JSON`` line."""

from __future__ import annotations

from typing import Any


def _num(value: float | None, fmt: str) -> str:
    if value is None or value != value:
        return "-"
    if value == float("inf"):
        return "inf"
    return format(value, fmt)


def report(result: dict[str, Any], sinks: list[tuple[str, str]]) -> str:
    """The table: ``result`` is what ``bench_worker`` prints as ``BENCH_JSON`` (it
    renders the JSON line too, where NaN and infinities are null); ``sinks`` are the
    worker rows, ``(key, label)``."""
    m = result["measured"]
    dirty = f", modified: {' '.join(m['dirty_worker_files'])}" if m["dirty_worker_files"] else ", clean"
    plan = result["plan"]
    lines = [
        f"worker benchmark ({result['mode']}): stepstream at {m['commit']}{dirty} ({m['path']})",
        f"{result['partitions']} partitions, {result['cpus']} CPUs, load average {result['loadavg_at_start']:.1f} at "
        f"start, {result['loadavg_at_end']:.1f} at end; {result['seconds']:.0f}s; best of {plan['rounds']} interleaved "
        f"round(s) (MongoDB: one round of at most {plan['mongo_budget']:.0f}s; SQLite: at most {plan['worker_budget']:.0f}s)",
        "off-CPU = 1 - CPU/wall of the process; runq = the part of it spent runnable, waiting for a core",
        *(["QUICK RUN: a smoke test; its figures are not comparable with the full run's (smaller corpora, "
           "worker windows of a fraction of a second to a few seconds)"] if result["mode"] == "quick" else []),
        "",
        f"{'corpus':<15}{'path':<40}{'events/s':>10}{'x bare':>8}{'x no-op':>9}{'x ingest':>10}"
        f"{'CPU us/ev':>11}{'off-CPU':>9}{'runq':>6}{'peak RSS':>10}",
    ]
    paths = [("bare", "bare aiokafka getmany + decode"), ("faust_noop", "faust no-op agent (ack only)"),
             ("ingest_file", "stepstream ingest-file -> SQLite")]  # fmt: skip
    for name, c in result["corpora"].items():
        for key, label in paths:
            f = c[key]
            lines.append(f"{name:<15}{label:<40}{_num(f['rate'], ',.0f'):>10}{'':>8}{'':>9}{'':>10}"
                         f"{_num(f['cpu_us_per_event'], '.1f'):>11}{_num(f['off_cpu_share'], '.0%'):>9}"
                         f"{_num(f['runqueue_share'], '.0%'):>6}")  # fmt: skip
        for key, label in sinks:
            f = c["worker"][key]
            if "na" in f:
                lines.append(f"{name:<15}{label:<40}{'n/a':>10}   ({f['na'].splitlines()[0][:90]})")
                continue
            lines.append(
                f"{name:<15}{label:<40}{_num(f['rate'], ',.0f'):>10}{_num(f['x_bare'], '.3f'):>8}"
                f"{_num(f['x_faust_noop'], '.2f'):>9}{_num(f['x_ingest_file'], '.2f'):>10}"
                f"{_num(f['cpu_us_per_event'], '.1f'):>11}{_num(f['off_cpu_share'], '.0%'):>9}"
                f"{_num(f['runqueue_share'], '.0%'):>6}{_num(f['peak_rss_mib'], '.0f'):>6} MiB"
            )
        lines.append(f"{'':<15}({c['events']:,} events, {c['runs']:,} runs, {c['delta_share']:.0%} thinking deltas, "
                     f"{c['mean_bytes']:.0f} B mean)")  # fmt: skip
        lines.append("")
    lines.extend(write_path_lines(result))
    lines.append("")
    lines.append("event-to-durable latency at half the worker's SQLite rate (durable: the run's stored last_seq "
                 "reached the event; polled every 50 ms)")  # fmt: skip
    lines.append(f"{'corpus':<15}{'target/s':>10}{'sent/s':>9}{'events':>9}{'deltas p50/p99 s':>19}"
                 f"{'others p50/p99 s':>19}{'never':>7}{'worker hist p99':>17}  verdict")  # fmt: skip
    for name, c in result["corpora"].items():
        lat = c["latency"]
        if "error" in lat:
            lines.append(f"{name:<15}n/a: {lat['error'].splitlines()[0][:100]}")
            continue
        d, o = lat["deltas"], lat["others"]
        verdict = "ok" if lat["pass"] else "MISSED"
        lines.append(
            f"{name:<15}{lat['target_rate']:>10,.0f}{lat['sent_rate']:>9,.0f}{lat['events']:>9,}"
            f"{_num(d['p50'], '.2f') + ' / ' + _num(d['p99'], '.2f'):>19}"
            f"{_num(o['p50'], '.2f') + ' / ' + _num(o['p99'], '.2f'):>19}"
            f"{d['unresolved'] + o['unresolved']:>7}{_num(lat['worker_histogram']['p99'], '.2f'):>16}s  {verdict} "
            f"(deltas <= {lat['targets']['deltas']:.0f} s, others <= {lat['targets']['others']:.0f} s)"
        )
    mem = result["memory"]
    lines.append("")
    if "error" in mem:
        lines.append(f"memory: n/a: {mem['error'].splitlines()[0][:100]}")
    else:
        verdict = "ok" if mem["peak_rss_mib"] < mem["target_mib"] else "MISSED"
        lines.append(f"memory: peak RSS with {mem['open_runs']:,} runs open mid-thinking: {mem['peak_rss_mib']:.0f} MiB "
                     f"(target < {mem['target_mib']} MiB: {verdict}; open_runs gauge {mem['open_runs_gauge']:.0f})")  # fmt: skip
    return "\n".join(lines)


def write_path_lines(result: dict[str, Any]) -> list[str]:
    """Per corpus, the write path without Kafka (``benchmarks.worker_profile``): CPU per
    process, rows upserted and bytes sent to / written by the SQLite writers, per event."""
    lines = [
        "write path into SQLite without Kafka, per event (benchmarks.worker_profile: the worker's pipeline, "
        "the step and deep writer processes)",
        f"{'corpus':<15}{'CPU us: worker':>15}{'steps wr':>9}{'deep wr':>8}{'all':>7}"
        f"{'rows: steps':>12}{'runs':>6}{'states':>7}{'deep':>6}{'req B: steps':>13}{'deep':>6}"
        f"{'wrote B: steps':>15}{'deep':>6}{'load':>6}",
    ]
    for name, c in result["corpora"].items():
        w = c.get("write_path")
        if not w or "error" in w:
            lines.append(f"{name:<15}n/a: {(w or {}).get('error', 'not measured').splitlines()[-1][:100]}")
            continue
        cpu, rows = w["cpu_us_per_event"], w["rows_per_event"]
        sent, wrote = w["request_bytes_per_event"], w["writer_wchar_per_event"]
        lines.append(
            f"{name:<15}{_num(cpu.get('main'), '.1f'):>15}{_num(cpu.get('writer steps'), '.1f'):>9}"
            f"{_num(cpu.get('writer deep'), '.1f'):>8}{_num(cpu.get('all'), '.1f'):>7}"
            f"{_num(rows.get('steps.steps'), '.3f'):>12}{_num(rows.get('steps.runs'), '.3f'):>6}"
            f"{_num(rows.get('steps.states'), '.3f'):>7}{_num(rows.get('deep.deep'), '.3f'):>6}"
            f"{_num(sent.get('steps'), '.0f'):>13}{_num(sent.get('deep'), '.0f'):>6}"
            f"{_num(wrote.get('steps'), '.0f'):>15}{_num(wrote.get('deep'), '.0f'):>6}{_num(w.get('loadavg'), '.1f'):>6}"
        )
    return lines


def finite(value: Any) -> Any:
    """The result with NaN and infinities as null, so the JSON line is strict JSON."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
