"""OpenTelemetry in: OTLP trace export requests to wire events (``docs/otel.md``).

* :mod:`~stepstream.otlp.spans`: the plain span the decoders build, and its bounds;
* :mod:`~stepstream.otlp.decode`: ``otlp_proto`` / ``otlp_json`` bytes to spans (detection;
  the two forms in :mod:`~stepstream.otlp.proto_form` and :mod:`~stepstream.otlp.json_form`);
* :mod:`~stepstream.otlp.identity`: which company and run a span belongs to;
* :mod:`~stepstream.otlp.messages`: an inference span's messages, whichever convention wrote them;
* :mod:`~stepstream.otlp.mapping`: spans to wire events (GenAI semconv, OpenInference,
  OpenLLMetry/Traceloop), with ids that make redelivery change nothing;
* :mod:`~stepstream.otlp.trace`: one request's spans to the numbered events of their runs.

Pure apart from the protobuf parser: no asyncio, no Kafka, no environment.
"""
