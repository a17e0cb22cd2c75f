"""Generate ``schemas/*.schema.json`` from the msgspec Structs (the one schema source),
and ``schemas/openapi.json``, the read API's document derived from the same Structs.

``python -m stepstream.schemagen [DIR]`` rewrites the files; a test fails when the
committed files and the Structs drift apart.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec

from stepstream.core import records, wire

SCHEMAS: dict[str, object] = {
    "wire-v1.schema.json": wire.Event,
    "step-record.schema.json": records.StepRecord,
    "deep-record.schema.json": records.DeepRecord,
    "run-record.schema.json": records.RunRecord,
    "run-state.schema.json": records.RunState,
}


def render() -> dict[str, str]:
    """File name -> JSON text (sorted keys, 2-space indent, trailing newline)."""
    out = {}
    for name, typ in SCHEMAS.items():
        schema = msgspec.json.schema(typ)
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["title"] = name.removesuffix(".schema.json")
        out[name] = json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0]) if args else Path("schemas")
    target.mkdir(parents=True, exist_ok=True)
    for name, text in (render() | {"openapi.json": render_openapi()}).items():
        (target / name).write_text(text, encoding="utf-8")
        print(f"wrote {target / name}", file=sys.stderr)
    return 0


def render_openapi() -> str:
    """The API's OpenAPI document, as ``stepstream api --ingest`` with ``STEPSTREAM_OTLP_TOPIC``
    serves it at ``/openapi.json`` (without ``--ingest`` the document lacks the ingest
    routes; without the topic, ``POST /v1/traces``)."""
    from stepstream.api.app import create_app
    from stepstream.api.event_log import MemoryEventLog
    from stepstream.api.ingest import Ingest, IngestLimits
    from stepstream.api.ratelimit import CompanyBuckets
    from stepstream.api.tokens import TokenRegistry
    from stepstream.metrics import ApiMetrics, IngestMetrics
    from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore

    metrics = ApiMetrics()
    ingest = Ingest(MemoryEventLog(), CompanyBuckets(0, 0), IngestLimits(), IngestMetrics(metrics.registry), otlp_topic="otlp")
    app = create_app(MemoryStepStore(), MemoryDeepStore(), TokenRegistry(Path("/nonexistent")), metrics, ingest=ingest)
    return json.dumps(app.litestar.openapi_schema.to_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
