"""An inference span's messages, from whichever convention wrote them.

Every form becomes the GenAI semantic conventions' message shape, a list of
``{"role": ..., "parts": [...]}`` with parts ``{"type": "text", "content": ...}``,
``{"type": "tool_call", "id", "name", "arguments"}``, ``{"type": "tool_call_response",
"id", "response"}`` and ``{"type": "reasoning", "content": ...}`` (other part types pass
through as they are). Forms, first present wins:

===========================================  ===========================================
input                                        output
===========================================  ===========================================
``gen_ai.system_instructions`` (prepended    ``gen_ai.output.messages``
as a ``system`` message) +
``gen_ai.input.messages``
``gen_ai.prompt.N.*`` (OpenLLMetry, older)   ``gen_ai.completion.N.*`` (role ``thinking``
                                             is reasoning)
``llm.input_messages.N.message.*``           ``llm.output_messages.N.message.*``
(OpenInference)
``input.value`` (parsed when JSON)           ``output.value`` (parsed when JSON)
===========================================  ===========================================

:func:`split_reasoning` takes the reasoning parts out of an output: they become a
thinking step, not text inside the output. Tool-call parts stay in the output: they are
the model's request; the tool spans are the executions.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["input_messages", "output_messages", "parse_json", "split_reasoning"]

_REASONING_TYPES = ("reasoning", "thinking")
_decode = msgspec.json.decode


def parse_json(value: Any) -> Any:
    """A string holding JSON as the value it holds; anything else (or text that is not
    JSON) as it is."""
    if type(value) is not str or not value or value[0] not in "[{\"":
        return value
    try:
        return _decode(value)
    except (msgspec.DecodeError, RecursionError):
        return value


def _indexed(attributes: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """``prefix.N.rest = value`` attributes as a list (by N) of ``{rest: value}``."""
    groups: dict[int, dict[str, Any]] = {}
    size = len(prefix)
    for key, value in attributes.items():  # one pass: most spans hold none of them
        if key.startswith(prefix):
            index, _, rest = key[size:].partition(".")
            if index.isdigit() and rest:
                groups.setdefault(int(index), {})[rest] = value
    return [groups[index] for index in sorted(groups)]


def _nested(flat: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return _indexed(flat, prefix)


def _semconv(value: Any) -> list[Any] | None:
    parsed = parse_json(value)
    if type(parsed) is list:
        return parsed
    return None


def _text_parts(content: Any) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    return [{"type": "text", "content": content}]


def _prompt_message(flat: dict[str, Any]) -> dict[str, Any]:
    """One ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*`` message (OpenLLMetry)."""
    role = flat.get("role") or "user"
    if role in _REASONING_TYPES:
        return {"role": "assistant", "parts": [{"type": "reasoning", "content": flat.get("content", "")}]}
    parts = _text_parts(flat.get("content"))
    for call in _nested(flat, "tool_calls."):
        parts.append(
            {"type": "tool_call", "id": call.get("id"), "name": call.get("name"), "arguments": parse_json(call.get("arguments"))}
        )
    if flat.get("tool_call_id") is not None:
        parts = [{"type": "tool_call_response", "id": flat["tool_call_id"], "response": flat.get("content")}]
    message: dict[str, Any] = {"role": role, "parts": parts}
    if flat.get("finish_reason") is not None:
        message["finish_reason"] = flat["finish_reason"]
    return message


def _openinference_message(flat: dict[str, Any]) -> dict[str, Any]:
    """One ``llm.*_messages.N.message.*`` message (OpenInference)."""
    role = flat.get("message.role") or "user"
    parts = _text_parts(flat.get("message.content"))
    for content in _nested(flat, "message.contents."):
        kind = content.get("message_content.type", "text")
        if kind in _REASONING_TYPES:
            parts.append({"type": "reasoning", "content": content.get("message_content.text", "")})
        elif kind == "text":
            parts.extend(_text_parts(content.get("message_content.text")))
        else:
            parts.append({"type": kind, **{k.removeprefix("message_content."): v for k, v in content.items()}})
    for call in _nested(flat, "message.tool_calls."):
        parts.append(
            {
                "type": "tool_call",
                "id": call.get("tool_call.id"),
                "name": call.get("tool_call.function.name"),
                "arguments": parse_json(call.get("tool_call.function.arguments")),
            }
        )
    if flat.get("message.tool_call_id") is not None:
        parts = [{"type": "tool_call_response", "id": flat["message.tool_call_id"], "response": flat.get("message.content")}]
    return {"role": role, "parts": parts}


def input_messages(attributes: dict[str, Any]) -> Any:
    """The span's input messages (module docstring), or ``None``."""
    messages = _semconv(attributes.get("gen_ai.input.messages"))
    system = _semconv(attributes.get("gen_ai.system_instructions"))
    if messages is not None or system is not None:
        head = [{"role": "system", "parts": system}] if system else []
        return head + (messages or [])
    prompts = _indexed(attributes, "gen_ai.prompt.")
    if prompts:
        return [_prompt_message(flat) for flat in prompts]
    flats = _indexed(attributes, "llm.input_messages.")
    if flats:
        return [_openinference_message(flat) for flat in flats]
    if "input.value" in attributes:
        return parse_json(attributes["input.value"])
    return None


def output_messages(attributes: dict[str, Any]) -> Any:
    """The span's output messages (module docstring), or ``None``."""
    messages = _semconv(attributes.get("gen_ai.output.messages"))
    if messages is not None:
        return messages
    completions = _indexed(attributes, "gen_ai.completion.")
    if completions:
        return [_prompt_message(flat) for flat in completions]
    flats = _indexed(attributes, "llm.output_messages.")
    if flats:
        return [_openinference_message(flat) for flat in flats]
    if "output.value" in attributes:
        return parse_json(attributes["output.value"])
    return None


def split_reasoning(output: Any) -> tuple[Any, str]:
    """``(output without its reasoning parts, the reasoning text)``. Only the message
    shape of the module docstring holds parts; any other output is returned as it is."""
    if type(output) is not list:
        return output, ""
    texts: list[str] = []
    kept: list[Any] = []
    for message in output:
        parts = message.get("parts") if type(message) is dict else None
        if type(parts) is not list:
            kept.append(message)
            continue
        rest = []
        for part in parts:
            if type(part) is dict and part.get("type") in _REASONING_TYPES:
                content = part.get("content")
                texts.append(content if type(content) is str else msgspec.json.encode(content).decode())
            else:
                rest.append(part)
        if rest or len(rest) == len(parts):
            kept.append({**message, "parts": rest})
    return kept, "\n".join(text for text in texts if text)
