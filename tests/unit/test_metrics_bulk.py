"""``metrics.observe_many`` is ``Histogram.observe`` per value, in one pass: it reads
prometheus-client internals, so this fails when they change."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stepstream.metrics import _LATENCY_BUCKETS, observe_many

values = st.lists(
    st.one_of(
        st.floats(min_value=0, max_value=1e6, allow_nan=False),
        st.sampled_from([0.0, *_LATENCY_BUCKETS]),  # on a bound: the bucket it closes
    ),
    max_size=200,
)


def samples(registry: CollectorRegistry) -> dict:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if not s.name.endswith("_created")
    }


@given(values, values)
def test_observe_many_equals_observe_per_value(first, second):
    one, many = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("lag_seconds", "x", ["kind"], buckets=_LATENCY_BUCKETS, registry=one)
    h2 = Histogram("lag_seconds", "x", ["kind"], buckets=_LATENCY_BUCKETS, registry=many)
    c1, c2 = h1.labels("other"), h2.labels("other")
    for batch in (first, second):
        for v in batch:
            c1.observe(v)
        observe_many(c2, batch)
    got, want = samples(many), samples(one)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key
