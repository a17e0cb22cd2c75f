"""The viewer's words and geometry (api/ui/present.py): the integrity banner says what
each counter means for the run, the timeline puts steps on one axis, the comparison
finds the first divergence with replay's rule."""

from __future__ import annotations

import msgspec

from stepstream.api.ui import present
from stepstream.api.views import Run, Step

RUN = dict(company_id="acme", run_id="r", agent_name="a", environment=None, status="completed", failure=None,
           started_at="2026-11-29T12:00:00.000000Z", ended_at="2026-11-29T12:00:10.000000Z", last_event_at=None,
           step_count=3, input_tokens=0, output_tokens=0, reasoning_tokens=0, truncated=False, dropped_steps=0,
           seq_gaps=0, late_events=0, deep_pruned_at=None)  # fmt: skip


def run(**fields) -> Run:
    return Run(**{**RUN, **fields})


def step(seq: int, kind: str = "tool", label: str | None = "search", start: int | None = 0, end: int | None = 1,
         arguments=None, status="ok") -> Step:  # fmt: skip
    at = lambda s: None if s is None else f"2026-11-29T12:00:{s:02d}.000000Z"  # noqa: E731
    return Step(step_seq=seq, kind=kind, label=label, status=status, call_id=None, arguments=arguments,
                input_shape=None, output_shape=None, started_at=at(start), ended_at=at(end))  # fmt: skip


def test_a_complete_run_has_no_findings():
    assert present.integrity(run()) == []
    assert present.integrity_summary(run()) == "complete"


def test_each_counter_in_plain_words():
    words = [f.text for f in present.integrity(run(seq_gaps=1), ((12, 14), (20, 20)))]
    assert words == ["4 events never arrived (seq 12-14, 20): the steps around them may be incomplete."]
    healed = present.integrity(run(seq_gaps=2))  # the gaps were filled by late events since
    assert healed[0].severity == "note" and "every missing event has arrived since" in healed[0].text
    texts = " ".join(f.text for f in present.integrity(run(late_events=1, dropped_steps=2, truncated=True,
                                                          deep_pruned_at="2026-11-30T00:00:00.000000Z",
                                                          status="abandoned")))  # fmt: skip
    for expected in ("1 event arrived late", "2 steps were dropped", "hit a cap", "pruned by retention", "abandoned"):
        assert expected in texts
    assert present.integrity_summary(run(seq_gaps=3, late_events=1)) == "3 gaps, 1 late"


def test_the_timeline_shares_one_axis_and_shows_idle_time():
    axis, bars = present.timeline(run(), [step(0, start=0, end=1), step(1, start=5, end=10), step(2, start=None)])
    assert axis == "10.0 s"
    assert bars[0] == present.Bar(0.0, 100.0) and bars[1] == present.Bar(500.0, 500.0)
    assert 2 not in bars  # no times: no bar


def test_compare_names_the_first_divergence():
    left = [step(0, "thinking", "reasoning"), step(1, arguments={"q": 1}), step(2, "llm", "openai/gpt")]
    same = present.compare(left, [step(5, arguments={"q": 1}), step(6, "llm", "openai/gpt")])
    assert same.report.divergence is None and "same 2 calls" in present.divergence_words(same)
    other = present.compare(left, [step(0, arguments={"q": 1}), step(1, "llm", "anthropic/claude")])
    assert other.report.divergence.field == "provider" and (other.first_left, other.first_right) == (2, 1)
    assert [p.differs for p in other.pairs] == [False, True]
    shorter = present.compare(left, [step(0, arguments={"q": 2})])
    assert shorter.report.divergence.field == "input"


def test_previews_are_bounded():
    text, chars = present.pretty({"q": "x" * 50_000})
    assert len(text) == present.PREVIEW_CHARS and chars > 50_000
    assert msgspec.json.decode(present.pretty({"b": 1, "a": [1]})[0]) == {"a": [1], "b": 1}
