"""The ledger against a naive model: every offset tracked one by one.

Whatever the order in which batches become durable and holds are taken and released,
the watermark (what faust commits) equals the offset after the longest prefix of
delivered offsets whose effects are durable, and it never moves backwards.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stepstream.pipeline.ledger import Ledger

TPS = ("p0", "p1")
RUNS = ("a", "b", "c")

ops = st.lists(
    st.one_of(
        st.tuples(st.just("deliver"), st.sampled_from(TPS), st.integers(1, 4)),
        st.tuples(st.just("hold"), st.sampled_from(TPS), st.sampled_from(RUNS)),
        # A redo (stale refusal) holds again an offset delivered earlier, still pending.
        st.tuples(st.just("rehold"), st.sampled_from(TPS), st.sampled_from(RUNS), st.integers(0, 20)),
        st.tuples(st.just("release"), st.sampled_from(RUNS)),
        st.tuples(st.just("seal")),
        st.tuples(st.just("durable"), st.integers(0, 3)),
        st.tuples(st.just("drop"), st.sampled_from(TPS)),
    ),
    max_size=80,
)


class Model:
    """Each delivered offset is pending until its batch is durable; a held offset is
    pending until its run is released into a batch and that batch is durable."""

    def __init__(self) -> None:
        self.next: dict[str, int] = {}
        self.open: set[tuple[str, int]] = set()
        self.sealed: list[set[tuple[str, int]]] = []
        self.held: dict[str, set[tuple[str, int]]] = {}
        self.hold_tp: dict[str, str] = {}

    def watermark(self, tp: str) -> int | None:
        if tp not in self.next:
            return None
        pending = {o for t, o in self.open if t == tp}
        for batch in self.sealed:
            pending |= {o for t, o in batch if t == tp}
        for run, offsets in self.held.items():
            pending |= {o for t, o in offsets if t == tp}
        return min(pending | {self.next[tp]})


@settings(max_examples=300, deadline=None, print_blob=True)
@given(ops)
def test_every_commit_equals_the_durable_watermark(script):
    ledger, model = Ledger(), Model()
    sealed = []
    last_mark: dict[str, int] = {}
    for op in script:
        kind = op[0]
        if kind == "deliver":
            _, tp, n = op
            first = model.next.get(tp, 0)
            ledger.delivered(tp, first, first + n - 1)
            model.next[tp] = first + n
            model.open |= {(tp, o) for o in range(first, first + n)}
        elif kind == "hold":
            _, tp, run = op
            # Only a delta just delivered into the open batch can be buffered in a tail.
            offset = model.next.get(tp, 0) - 1
            if (tp, offset) not in model.open or model.hold_tp.get(run, tp) != tp:
                continue
            ledger.hold((run, run), tp, offset, 0.0)
            model.hold_tp[run] = tp
            model.held.setdefault(run, set()).add((tp, offset))
        elif kind == "rehold":
            _, tp, run, back = op
            pending = sorted({o for t, o in model.open if t == tp}.union(*({o for t, o in b if t == tp} for b in model.sealed)))
            if not pending or run in model.hold_tp:
                continue
            offset = pending[back % len(pending)]
            ledger.hold((run, run), tp, offset, 0.0)
            model.hold_tp[run] = tp
            model.held.setdefault(run, set()).add((tp, offset))
        elif kind == "release":
            _, run = op
            ledger.release((run, run))
            model.open |= model.held.pop(run, set())
            model.hold_tp.pop(run, None)
        elif kind == "seal":
            sealed.append(ledger.seal())
            model.sealed.append(model.open)
            model.open = set()
        elif kind == "durable":
            if sealed:
                i = op[1] % len(sealed)
                ledger.durable(sealed.pop(i))
                model.sealed.pop(i)
        elif kind == "drop":
            _, tp = op
            runs = ledger.drop([tp])
            assert runs == {(r, r) for r, t in model.hold_tp.items() if t == tp}
            model.next.pop(tp, None)
            model.open = {(t, o) for t, o in model.open if t != tp}
            model.sealed = [{(t, o) for t, o in b if t != tp} for b in model.sealed]
            for run in [r for r, t in model.hold_tp.items() if t == tp]:
                model.held.pop(run, None)
                model.hold_tp.pop(run)
            last_mark.pop(tp, None)
        for tp in TPS:
            mark = ledger.watermark(tp)
            assert mark == model.watermark(tp), (op, tp)
            if mark is not None:
                assert mark >= last_mark.get(tp, 0), "the watermark moved backwards"
                last_mark[tp] = mark


def test_expired_holds_come_oldest_first_and_stop_at_the_first_young_one():
    ledger = Ledger()
    ledger.delivered("p0", 0, 9)
    ledger.hold(("c", "a"), "p0", 2, now=1.0)
    ledger.hold(("c", "b"), "p0", 5, now=4.0)
    ledger.hold(("c", "c"), "p0", 7, now=9.0)
    assert list(ledger.expired_holds(now=10.0, max_age=5.0)) == [("c", "a"), ("c", "b")]
    assert ledger.oldest_hold_age(10.0) == 9.0
    ledger.release(("c", "a"))
    assert ledger.watermark("p0") == 0  # the open batch still holds offset 0 on
    ledger.durable(ledger.seal())
    assert ledger.watermark("p0") == 5


def test_a_hold_released_into_a_sealed_batch_holds_the_watermark_until_that_batch_is_durable():
    """After a stale refusal the pipeline redoes a run inside the refused batch's write:
    the run's held offset (taken in an earlier batch) then rides on that batch, not on
    the open one, so the watermark passes it only once the redo is written."""
    ledger = Ledger()
    ledger.delivered("p0", 0, 0)
    ledger.hold(("acme", "r"), "p0", 0, now=0.0)
    ledger.durable(ledger.seal())
    assert ledger.watermark("p0") == 0  # the hold
    ledger.delivered("p0", 1, 1)
    refused = ledger.seal()
    ledger.release(("acme", "r"), refused)
    assert ledger.held_runs == 0
    assert ledger.watermark("p0") == 0  # still held, by the sealed batch now
    ledger.delivered("p0", 2, 2)
    assert ledger.watermark("p0") == 0
    ledger.durable(refused)
    assert ledger.watermark("p0") == 2  # the open batch (offset 2) is not durable yet


def test_a_redo_holding_an_earlier_offset_again_holds_the_watermark_there():
    """A stale refusal's redo applies a run's journal again and holds its tail's first
    offset again, after other runs took holds at later offsets: the watermark must stay
    at the earliest hold, not the first one taken (a worker test lost the deltas of two
    runs that way: committed past them on a revocation)."""
    ledger = Ledger()
    ledger.delivered("p0", 0, 9)
    ledger.hold(("c", "early"), "p0", 3, now=1.0)
    refused = ledger.seal()
    ledger.hold(("c", "late"), "p0", 8, now=2.0)
    ledger.release(("c", "early"), refused)  # the redo: the old hold rides on the refused batch
    ledger.hold(("c", "early"), "p0", 3, now=3.0)  # ... and the journal applied again holds it anew
    ledger.durable(refused)
    assert ledger.watermark("p0") == 3
    ledger.release(("c", "early"))
    ledger.durable(ledger.seal())
    assert ledger.watermark("p0") == 8
    assert list(ledger.expired_holds(now=10.0, max_age=5.0)) == [("c", "late")]
