"""Caps: clip on a code point boundary, marker within the cap, idempotent; positional
chunks clip to the same text as the whole; the sink-side ``clip_deep``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from stepstream.core.caps import CLIP_MARKER, clip, clip_chunk, clip_deep, json_body, json_text, stored_body
from stepstream.core.fold import Limits
from stepstream.core.records import DeepRecord

PROPS = settings(max_examples=300, deadline=None, print_blob=True)
# Astral characters (4 UTF-8 bytes, surrogate pairs in UTF-16), combining marks, ZWJ sequences.
chars = st.sampled_from(["a", "é", "e\u0301", "日", "😀", "👩‍💻", "🇪🇺", "𝔘", "\U0010fffd", "\n", "\x00"])
texts = st.lists(chars, max_size=80).map("".join)


def test_short_text_is_untouched():
    assert clip("hello", 5) == ("hello", False)
    assert clip("", 0) == ("", False)


def test_long_text_keeps_its_head_and_a_visible_marker_within_the_cap():
    text, cut = clip("x" * 100, 20)
    assert cut and len(text) == 20 and text == "x" * (20 - len(CLIP_MARKER)) + CLIP_MARKER


def test_astral_characters_are_never_split():
    text, cut = clip("😀" * 30, 15)
    assert cut and text == "😀" * (15 - len(CLIP_MARKER)) + CLIP_MARKER
    assert text.encode("utf-8").decode("utf-8") == text


def test_a_cap_smaller_than_the_marker_still_holds():
    text, cut = clip("abcdef", 3)
    assert cut and len(text) == 3


@PROPS
@given(texts, st.integers(0, 60))
def test_clip_is_a_prefix_within_the_cap_and_idempotent(text, cap):
    out, cut = clip(text, cap)
    assert len(out) <= cap
    assert cut == (len(text) > cap)
    head = out[: len(out) - len(CLIP_MARKER)] if cut and cap >= len(CLIP_MARKER) else out
    if cut and cap < len(CLIP_MARKER):
        head = ""
    assert text.startswith(head)
    out.encode("utf-8")  # valid UTF-8: no split code point
    assert clip(out, cap) == (out, False)


@PROPS
@given(st.lists(texts, max_size=8), st.integers(len(CLIP_MARKER), 90))
def test_chunks_clip_to_the_clip_of_the_whole(chunks, cap):
    stored, durable, clipped = "", 0, False
    for chunk in chunks:
        if clipped:
            durable += len(chunk)  # what the fold does: count only
            continue
        piece, offset, cut = clip_chunk(chunk, durable, cap)
        assert offset <= len(stored) and offset + len(piece) <= cap
        stored = stored[:offset] + piece
        durable += len(chunk)
        clipped = clipped or cut
    whole, cut = clip("".join(chunks), cap)
    assert stored == whole and clipped == cut


def test_json_body_is_json_text_clipped():
    assert json_text("é") == '"é"' and json_text({"a": [1, None]}) == '{"a":[1,null]}'
    body, cut = json_body({"k": "v" * 50}, 20)
    assert cut and len(body) == 20 and body.startswith('{"k":"vvv')


def test_clip_deep_enforces_every_cap_and_leaves_good_records_alone():
    lim = Limits(reasoning_chars=30, output_chars=20, arguments_chars=10)
    good = DeepRecord(company_id="c", run_id="r", step_seq=0, kind="tool", ts="t", arguments="1234", output="x")
    assert clip_deep(good, lim) is good
    bad = DeepRecord(company_id="c", run_id="r", step_seq=0, kind="tool", ts="t", arguments="a" * 11, output="b" * 21)
    fixed = clip_deep(bad, lim)
    assert fixed.clipped and len(fixed.arguments) == 10 and len(fixed.output) == 20
    assert clip_deep(fixed, lim) is fixed
    chunk = DeepRecord(
        company_id="c", run_id="r", step_seq=0, kind="thinking", ts="t", reasoning="z" * 20, reasoning_offset=25
    )
    fixed = clip_deep(chunk, lim)
    assert (
        fixed.clipped and fixed.reasoning_offset + len(fixed.reasoning) == 30 and fixed.reasoning.endswith(CLIP_MARKER)
    )
    late = DeepRecord(
        company_id="c", run_id="r", step_seq=0, kind="thinking", ts="t", reasoning="z", reasoning_offset=40
    )
    fixed = clip_deep(late, lim)
    assert fixed.reasoning == CLIP_MARKER and fixed.reasoning_offset == 30 - len(CLIP_MARKER)


def test_json_body_counts_what_a_reader_sees():
    # A string by its characters, kept as the string.
    assert json_body("\x00" * 100, 100) == ("\x00" * 100, False)
    assert json_body("é" * 20, 15) == ("é" * 5 + CLIP_MARKER, True)
    # Any other value by its compact JSON text; unclipped, the value itself.
    value = {"a": [1, None, "\n"]}
    assert json_text(value) == '{"a":[1,null,"\\n"]}'
    assert json_body(value, len(json_text(value))) == (value, False)
    body, cut = json_body(value, len(json_text(value)) - 1)
    assert cut and isinstance(body, str) and len(body) == len(json_text(value)) - 1
    assert json_body(None, 10) == (None, False) and json_body(12, 1) == ("…", True)


def test_clip_deep_measures_structured_bodies_by_their_json_text():
    lim = Limits(output_chars=20, arguments_chars=14)
    fits = DeepRecord(company_id="c", run_id="r", step_seq=0, kind="tool", ts="t", arguments={"k": "v"}, output=[1])
    assert clip_deep(fits, lim) is fits
    over = DeepRecord(company_id="c", run_id="r", step_seq=0, kind="tool", ts="t", arguments={"k": "\n" * 6})
    fixed = clip_deep(over, lim)  # 6 characters of text, 20 of compact JSON: over the cap
    assert fixed.clipped and fixed.arguments == '{"k"' + CLIP_MARKER
    assert clip_deep(fixed, lim) is fixed  # clipping is idempotent


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)


@PROPS
@given(json_values, st.integers(0, 60))
def test_stored_body_is_the_json_text_of_json_body(value, cap):
    """``stored_body`` (the SQLite writer's one encoding) stores exactly what
    ``json_body`` keeps, and says it was cut exactly when ``json_body`` does."""
    body, cut = json_body(value, cap)
    assert stored_body(value, cap) == (json_text(body), cut)
