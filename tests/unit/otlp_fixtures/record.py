"""Record the golden OTLP fixtures of tests/unit/test_otlp_*.py from the real libraries.

    .venv/bin/python tests/unit/otlp_fixtures/record.py [--out DIR] [--otlp-http URL] [FAMILY ...]

Each convention family runs in its own process (instrumentors patch the openai client
globally): an agent built with the real ``openai`` client, instrumented by
``opentelemetry-instrumentation-openai-v2`` (GenAI semconv, agent and tool spans from
``opentelemetry-util-genai``), ``openinference-instrumentation-openai`` (OpenInference,
agent and tool spans from ``openinference-instrumentation``'s tracer) or Traceloop's
``opentelemetry-instrumentation-openai`` (OpenLLMetry), against a local HTTP server that
answers with fixed completions: a tool call (two tools, one of which fails), reasoning,
then the final answer. The SDK's in-memory exporter collects the spans, and the SDK's
own OTLP encoder writes them as ``FAMILY.pb`` (otlp_proto) and ``FAMILY.json``
(otlp_json, as the Collector's marshaler writes it: hex ids, integer enums). With
``--otlp-http URL`` the same spans are also sent, in one request per family, by the SDK's
OTLP/HTTP exporter to ``URL`` (a Collector's ``/v1/traces``; a failed export exits non-zero).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).parent
FAMILIES = ("genai", "openinference", "traceloop")
# Families recorded with other releases than the project pins, each in a throwaway venv
# of exactly these packages (README.md beside this file): not re-recorded by the tests.
LEGACY_PINS = {
    "traceloop_indexed": (
        "opentelemetry-instrumentation-openai==0.50.1", "openai==3.51.0", "opentelemetry-sdk==1.45.2",
        "opentelemetry-exporter-otlp-proto-common==1.45.2", "opentelemetry-proto==1.45.2", "protobuf==7.36.2",
    ),
}
SECRET = "sk-test-FIXTURE0123456789abcdefghij"

_TOOL_CALLS = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1764633600,
    "model": "gpt-4o-mini-2024-07-18",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "reasoning_content": "The user wants the weather; I should call get_weather for Paris.",
                "tool_calls": [
                    {"id": "call_weather_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "api_key": SECRET})}},
                    {"id": "call_lookup_2", "type": "function",
                     "function": {"name": "lookup_account", "arguments": json.dumps({"user": "ada"})}},
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 42, "completion_tokens": 17, "total_tokens": 59,
              "completion_tokens_details": {"reasoning_tokens": 11},
              "prompt_tokens_details": {"cached_tokens": 8}},
}
_ANSWER = {
    "id": "chatcmpl-2",
    "object": "chat.completion",
    "created": 1764633601,
    "model": "gpt-4o-mini-2024-07-18",
    "choices": [
        {"index": 0, "finish_reason": "stop",
         "message": {"role": "assistant", "content": "It is 18 degrees and sunny in Paris."}}
    ],
    "usage": {"prompt_tokens": 80, "completion_tokens": 12, "total_tokens": 92},
}


class _Handler(BaseHTTPRequestHandler):
    calls = 0

    def do_POST(self):  # noqa: N802 - the http.server API
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = json.dumps(_TOOL_CALLS if _Handler.calls % 2 == 0 else _ANSWER).encode()
        _Handler.calls += 1
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _tools(name: str, arguments: dict) -> str:
    if name == "lookup_account":
        raise PermissionError("account lookup denied")
    return json.dumps({"temperature_c": 18, "sky": "sunny"})


def _conversation(client, run_tool):
    """The agent loop: ask, run each requested tool (through ``run_tool``), answer."""
    messages = [
        {"role": "system", "content": "You are a weather assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    first = client.chat.completions.create(model="gpt-4o-mini", messages=messages, temperature=0.2, max_tokens=256)
    reply = first.choices[0].message
    messages.append({"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in reply.tool_calls]})
    for call in reply.tool_calls:
        arguments = json.loads(call.function.arguments)
        try:
            result = run_tool(call.function.name, call.id, arguments)
        except PermissionError as exc:
            result = json.dumps({"error": str(exc)})
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    final = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
    return final.choices[0].message.content


def _record(family: str, out: Path) -> None:
    os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
    os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "SPAN_ONLY"
    os.environ["TRACELOOP_TRACE_CONTENT"] = "true"
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import openai

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": f"weather-agent-{family}"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    server = _server()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.server_port}/v1", api_key=SECRET, max_retries=0)

    if family == "genai":
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
        from opentelemetry.util.genai.handler import TelemetryHandler
        from opentelemetry.util.genai.types import Error

        OpenAIInstrumentor().instrument(tracer_provider=provider)
        handler = TelemetryHandler(tracer_provider=provider)

        def run_tool(name, call_id, arguments):
            invocation = handler.tool(name, tool_call_id=call_id, tool_type="function")
            invocation.arguments = arguments
            try:
                result = _tools(name, arguments)
            except PermissionError as exc:
                invocation.fail(Error(message=str(exc), type=type(exc).__qualname__, exception=exc))
                raise
            invocation.tool_result = result
            invocation.stop()
            return result

        agent = handler.invoke_local_agent(agent_name="weather-agent", request_model="gpt-4o-mini")
        agent.conversation_id = "conv-genai-1"
        _conversation(client, run_tool)
        agent.stop()
    elif family == "openinference":
        from openinference.instrumentation import OITracer, TraceConfig, using_session
        from openinference.instrumentation.openai import OpenAIInstrumentor
        from opentelemetry.trace import Status, StatusCode

        OpenAIInstrumentor().instrument(tracer_provider=provider)
        tracer = OITracer(provider.get_tracer("weather-agent"), config=TraceConfig())

        def run_tool(name, call_id, arguments):
            with tracer.start_as_current_span(name, openinference_span_kind="tool") as span:
                span.set_tool(name=name, parameters=arguments)
                span.set_attribute("tool_call.id", call_id)
                span.set_input(arguments)
                try:
                    result = _tools(name, arguments)
                except PermissionError as exc:
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, str(exc)))
                    raise
                span.set_output(result)
                return result

        with using_session("session-oi-1"):
            with tracer.start_as_current_span("weather-agent", openinference_span_kind="agent") as agent:
                agent.set_input("What is the weather in Paris?")
                agent.set_attribute("agent.name", "weather-agent")
                agent.set_output(_conversation(client, run_tool))
    elif family in ("traceloop", "traceloop_indexed"):
        # The same agent; traceloop_indexed is recorded with an older release of the
        # instrumentation (LEGACY_PINS), which writes gen_ai.prompt.N.* / gen_ai.completion.N.*.
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor
        from opentelemetry.trace import Status, StatusCode

        OpenAIInstrumentor().instrument(tracer_provider=provider)
        tracer = provider.get_tracer("weather-agent")

        def run_tool(name, call_id, arguments):
            with tracer.start_as_current_span(f"{name}.tool") as span:
                span.set_attribute("traceloop.span.kind", "tool")
                span.set_attribute("traceloop.entity.name", name)
                span.set_attribute("traceloop.entity.input", json.dumps({"inputs": arguments}))
                try:
                    result = _tools(name, arguments)
                except PermissionError as exc:
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, str(exc)))
                    raise
                span.set_attribute("traceloop.entity.output", json.dumps(result))
                return result

        with tracer.start_as_current_span("weather-agent.workflow") as agent:
            agent.set_attribute("traceloop.span.kind", "workflow")
            agent.set_attribute("traceloop.workflow.name", "weather-agent")
            agent.set_attribute("traceloop.entity.name", "weather-agent")
            agent.set_attribute("traceloop.association.properties.session_id", "session-tl-1")
            agent.set_attribute("traceloop.entity.output", json.dumps(_conversation(client, run_tool)))
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    request = encode_spans(spans)
    (out / f"{family}.pb").write_bytes(request.SerializeToString())
    document = MessageToDict(request, use_integers_for_enums=True)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for field in ("traceId", "spanId", "parentSpanId"):
                    if field in span:
                        span[field] = __import__("base64").b64decode(span[field]).hex()
    (out / f"{family}.json").write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    endpoint = os.environ.get("_RECORD_OTLP_HTTP")
    if endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import SpanExportResult

        sender = OTLPSpanExporter(endpoint=endpoint, timeout=10)
        result = sender.export(spans)
        sender.shutdown()
        if result is not SpanExportResult.SUCCESS:
            raise SystemExit(f"{family}: the OTLP/HTTP export to {endpoint} failed ({result})")
    print(f"{family}: {len(spans)} spans", file=sys.stderr)
    if family in LEGACY_PINS:
        from importlib.metadata import version

        installed = tuple(f"{pin.split('==')[0]}=={version(pin.split('==')[0])}" for pin in LEGACY_PINS[family])
        if installed != LEGACY_PINS[family]:
            raise SystemExit(f"{family}: recorded with {installed}, expected {LEGACY_PINS[family]}")


def main(argv: list[str]) -> None:
    out = HERE
    if argv[:1] == ["--out"]:
        out, argv = Path(argv[1]), argv[2:]
    if argv[:1] == ["--otlp-http"]:
        os.environ["_RECORD_OTLP_HTTP"], argv = argv[1], argv[2:]
    names = argv or list(FAMILIES)
    if len(names) == 1 and os.environ.get("_RECORD_CHILD"):
        _record(names[0], out)
        return
    for name in names:
        env = {**os.environ, "_RECORD_CHILD": "1"}
        subprocess.run([sys.executable, __file__, "--out", str(out), name], check=True, env=env)


if __name__ == "__main__":
    main(sys.argv[1:])
