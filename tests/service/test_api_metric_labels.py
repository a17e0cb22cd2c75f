"""Every label of the API's metrics comes from a fixed set, whatever the client sends
(issue 19, item 10): h11 accepts any token as a method, so a method outside the
standard ones is labelled ``other``; a route is its template (``unmatched`` for none),
never the raw path; a status is a code. Distinct methods, paths and ids must not
grow ``/metrics``."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stepstream.api.app import METHOD_LABELS
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore
from api_support import bearer, client, make_app


def series(registry) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {
        (sample.name, tuple(sorted(sample.labels.items())))
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }


def label_values(registry) -> dict[str, set[str]]:
    values: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        if family.name.startswith("stepstream_api_"):
            for sample in family.samples:
                for name, value in sample.labels.items():
                    if name != "le":
                        values.setdefault(name, set()).add(value)
    return values


async def test_distinct_methods_paths_and_ids_make_no_new_labels(tmp_path):
    app = make_app(MemoryStepStore(), MemoryDeepStore(), tmp_path / "tokens.json")
    async with client(app) as http:
        await http.get("/healthz")
        for i in range(300):
            await http.request(f"X-METHOD-{i}", f"/v1/companies/acme/runs/r{i}", headers=bearer(None))
            await http.request(f"M{i}", "/healthz")
            await http.get(f"/no/such/path/{i}")
            await http.get(f"/v1/companies/co{i}/runs/r{i}", headers=bearer(f"sst_{i:012x}_" + "A" * 43))
        before = series(app.metrics.registry)
        for i in range(300, 600):
            await http.request(f"X-METHOD-{i}", f"/v1/companies/acme/runs/r{i}")
            await http.get(f"/no/such/path/{i}")
        assert series(app.metrics.registry) == before  # no new series
        assert len(before) < 100
    labels = label_values(app.metrics.registry)
    assert labels["method"] <= METHOD_LABELS | {"other"} and "other" in labels["method"]
    assert labels["route"] == {"/healthz", "/v1/companies/{company}/runs/{run_id}", "unmatched"}
    assert all(status.isdigit() and 100 <= int(status) <= 599 for status in labels["status"])
