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

__all__ = ["parse_json", "span_messages", "split_reasoning"]

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


_PROMPTS, _COMPLETIONS = "gen_ai.prompt.", "gen_ai.completion."
_INPUTS, _OUTPUTS = "llm.input_messages.", "llm.output_messages."
_SPAN_FORMS = (_PROMPTS, _COMPLETIONS, _INPUTS, _OUTPUTS)
_CONTENTS, _TOOL_CALLS = "message.contents.", "message.tool_calls."


def _indexed(attributes: dict[str, Any], prefixes: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
    """``prefix.N.rest = value`` attributes, for each of ``prefixes`` (none of them the
    start of another), as a list (by N) of ``{rest: value}``; a prefix without any is
    absent. One pass, whatever the number of prefixes: most spans hold none of them, and
    the comprehension finds that in the fewest bytecodes."""
    keys = [key for key in attributes if key.startswith(prefixes)]
    if not keys:
        return {}
    found: dict[str, list[dict[str, Any]]] = {}
    for prefix in prefixes:
        groups: dict[int, dict[str, Any]] = {}
        size = len(prefix)
        for key in keys if len(prefixes) == 1 else [key for key in keys if key.startswith(prefix)]:
            index, _, rest = key[size:].partition(".")
            if rest and index.isdigit():
                group = groups.get(number := int(index))
                if group is None:
                    groups[number] = {rest: attributes[key]}
                else:
                    group[rest] = attributes[key]
        if groups:
            found[prefix] = [groups[index] for index in sorted(groups)]
    return found


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
    for call in _indexed(flat, ("tool_calls.",)).get("tool_calls.", ()):
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
    nested = _indexed(flat, (_CONTENTS, _TOOL_CALLS))
    for content in nested.get(_CONTENTS, ()):
        kind = content.get("message_content.type", "text")
        if kind in _REASONING_TYPES:
            parts.append({"type": "reasoning", "content": content.get("message_content.text", "")})
        elif kind == "text":
            parts.extend(_text_parts(content.get("message_content.text")))
        else:
            parts.append({"type": kind, **{k.removeprefix("message_content."): v for k, v in content.items()}})
    for call in nested.get(_TOOL_CALLS, ()):
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


def span_messages(attributes: dict[str, Any]) -> tuple[Any, Any]:
    """The span's ``(input messages, output messages)`` (module docstring), each ``None``
    when the span holds none. The indexed forms are found in one pass over the attributes,
    made only when the GenAI attributes are missing."""
    inputs = _semconv(attributes.get("gen_ai.input.messages"))
    system = _semconv(attributes.get("gen_ai.system_instructions"))
    if inputs is not None or system is not None:
        inputs = ([{"role": "system", "parts": system}] if system else []) + (inputs or [])
    outputs = _semconv(attributes.get("gen_ai.output.messages"))
    indexed = _indexed(attributes, _SPAN_FORMS) if inputs is None or outputs is None else {}
    if inputs is None:
        inputs = _indexed_messages(indexed, _PROMPTS, _INPUTS, attributes, "input.value")
    if outputs is None:
        outputs = _indexed_messages(indexed, _COMPLETIONS, _OUTPUTS, attributes, "output.value")
    return inputs, outputs


def _indexed_messages(indexed: dict[str, list[dict[str, Any]]], openllmetry: str, openinference: str,
                      attributes: dict[str, Any], value: str) -> Any:  # fmt: skip
    if openllmetry in indexed:
        return [_prompt_message(flat) for flat in indexed[openllmetry]]
    if openinference in indexed:
        return [_openinference_message(flat) for flat in indexed[openinference]]
    if value in attributes:
        return parse_json(attributes[value])
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
