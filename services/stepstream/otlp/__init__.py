"""OpenTelemetry in: OTLP trace export requests to wire events (``docs/otel.md``).

* :mod:`~stepstream.otlp.spans`: the plain span the decoders build, and its bounds;
* :mod:`~stepstream.otlp.decode`: ``otlp_proto`` / ``otlp_json`` bytes to spans;
* :mod:`~stepstream.otlp.identity`: which company and run a span belongs to;
* :mod:`~stepstream.otlp.mapping`: spans to wire events (GenAI semconv, OpenInference,
  OpenLLMetry/Traceloop), with ids that make redelivery change nothing.

Pure apart from the protobuf parser: no asyncio, no Kafka, no environment.
"""
