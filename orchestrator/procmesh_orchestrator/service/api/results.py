"""Results and chunks in the reference server's shapes (camelCase), as the HTTP API sends them and
the CLI prints them; the gRPC API's proto twins (`service.grpc.responses`) take the same calls and
results from `all_calls` and `all_results`."""

from __future__ import annotations

import base64
import json
from typing import Any

from procmesh_orchestrator.run import RunResult
from procmesh_orchestrator.service.api.ui_messages import ui_messages

Chunk = dict[str, Any]


def model_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Response messages as AI SDK model messages: the assistant's text and tool-call parts, and a
    ``tool`` message with the results of the calls that have one (what the client sends back)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        content: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for part in (message.get("content") or {}).get("parts") or []:
            if part.get("type") == "text" and part.get("text"):
                content.append({"type": "text", "text": part["text"]})
            elif part.get("type") == "tool-invocation":
                inv = part["toolInvocation"]
                call = {"toolCallId": inv["toolCallId"], "toolName": inv["toolName"]}
                content.append({"type": "tool-call", **call, "input": inv.get("args")})
                if inv.get("state") == "result":
                    output = {"type": "json", "value": inv.get("result")}
                    results.append({"type": "tool-result", **call, "output": output})
        if content:
            out.append({"role": "assistant", "content": content})
        if results:
            out.append({"role": "tool", "content": results})
    return out


def _call_chunks(calls: list[dict[str, Any]], run_id: str) -> list[Chunk]:
    """Tool calls as the reference's ``tool-call`` chunks (``response.toolCalls``)."""
    return [
        {
            "type": "tool-call",
            "runId": run_id,
            "from": "AGENT",
            "payload": {
                "toolCallId": call.get("toolCallId"),
                "toolName": call.get("toolName"),
                "args": call.get("args"),
            },
        }
        for call in calls
    ]


def _result_chunks(results: list[dict[str, Any]], run_id: str) -> list[Chunk]:
    """Tool results as the reference's ``tool-result`` chunks."""
    return [{"type": "tool-result", "runId": run_id, "from": "AGENT", "payload": dict(r)} for r in results]


def all_calls(result: RunResult) -> list[dict[str, Any]]:
    """Every step's tool calls, then the suspended ones (their step is not recorded yet)."""
    calls = [call for step in result.steps for call in step.get("toolCalls") or []]
    seen = {call.get("toolCallId") for call in calls}
    return calls + [call for call in result.suspended if call.get("toolCallId") not in seen]


def all_results(result: RunResult) -> list[dict[str, Any]]:
    """Every step's tool results."""
    return [r for step in result.steps for r in step.get("toolResults") or []]


def _step_json(step: dict[str, Any], run_id: str) -> dict[str, Any]:
    """A step as the client's `LLMStepResult` declares it: its calls and results as chunks (all
    static: procmesh has no dynamic tools), and empty lists or null where procmesh has nothing."""
    calls = _call_chunks(step.get("toolCalls") or [], run_id)
    results = _result_chunks(step.get("toolResults") or [], run_id)
    reasoning = [
        {"type": "reasoning", "runId": run_id, "from": "AGENT", "payload": r}
        for r in step.get("reasoning") or []
    ]
    content: list[dict[str, Any]] = [{"type": "text", "text": step["text"]}] if step.get("text") else []
    content += [{"type": "tool-call", **c["payload"], "input": c["payload"]["args"]} for c in calls]
    content += [{"type": "tool-result", **r["payload"]} for r in results]
    return {
        **_NOTHING,
        **step,
        "toolCalls": calls,
        "toolResults": results,
        "staticToolCalls": calls,
        "staticToolResults": results,
        "dynamicToolCalls": [],
        "dynamicToolResults": [],
        "reasoning": reasoning,
        "reasoningText": step.get("reasoningText"),
        "sources": [
            {"type": "source", "runId": run_id, "from": "AGENT", "payload": s}
            for s in step.get("sources") or []
        ],
        "content": [{"type": "reasoning", "text": r["payload"]["text"]} for r in reasoning] + content,
    }


_NOTHING: dict[str, Any] = {
    "reasoning": [],
    "reasoningText": None,
    "sources": [],
    "files": [],
    "warnings": [],
    "providerMetadata": None,
    "request": {},
}
"""The fields of a result and of a step the client's types declare that procmesh has nothing for:
no provider's files reach a result yet, and no request body is echoed (reasoning and sources: a
step's, when its model gave them)."""


def result_json(result: RunResult, warnings: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The generate() result as the reference server returns it (camelCase), with `status`.

    Every field of the client's `FullOutput` is there (empty lists, ``false`` or null where
    procmesh has nothing), `warnings` the call's own (`calls.AgentCall.warnings`).
    ``toolCalls`` holds every step's calls as ``tool-call`` chunks (the client runs those of its
    client tools at finish reason ``tool-calls``; ``response.messages`` are then AI SDK model
    messages, the stored form in ``response.dbMessages``), the one awaiting approval last
    (finish reason ``suspended``, also as ``suspendPayload``); ``toolResults`` their results as
    ``tool-result`` chunks, as each step's are (`_step_json`).
    """
    response: dict[str, Any] = {"messages": result.response_messages}
    if result.finish_reason == "tool-calls" and result.steps and result.status != "suspended":
        response = {
            "messages": model_messages(result.response_messages),
            "dbMessages": result.response_messages,
        }
    response["modelId"] = result.model_id  # the model that answered (a fallback, when one did)
    response["uiMessages"] = ui_messages(result.response_messages)  # with each one's metadata
    run_id = result.run_id
    steps = [_step_json(s, run_id) for s in result.steps]
    out: dict[str, Any] = {
        **_NOTHING,
        "reasoning": [r for s in steps for r in s["reasoning"]],
        "sources": [source for s in steps for source in s["sources"]],
        "reasoningText": "".join(s["reasoningText"] or "" for s in steps) or None,
        "warnings": [*(warnings or []), *model_warnings(result)],
        "runId": run_id,
        "status": result.status,
        "text": result.text,
        "finishReason": result.finish_reason,
        "steps": steps,
        "usage": result.usage,
        "totalUsage": result.usage,
        "tripwire": result.tripwire,
        "toolCalls": _call_chunks(all_calls(result), run_id),
        "toolResults": _result_chunks(all_results(result), run_id),
        "messages": result.response_messages,
        "response": response,
        "violations": result.violations,
        "traceId": result.trace_id,
        "spanId": None,
        "object": result.object,
        "usedFallbackValue": result.used_fallback_value,
        "suspendPayload": None,
    }
    if result.status == "suspended" and result.suspended:
        first = result.suspended[0]
        out["suspendPayload"] = {k: first.get(k) for k in ("toolCallId", "toolName", "args")}
        if "suspendPayload" in first:  # the tool suspended itself: what it asked (the reference's)
            out["suspendPayload"]["suspendPayload"] = first["suspendPayload"]
    if result.error is not None:  # `error` is undefined in the client's type unless the run failed
        out["error"] = result.error
    return out


def model_warnings(result: RunResult) -> list[dict[str, Any]]:
    """The warnings of the run's model calls (each step's ``warnings``: settings a model's API has
    no field for), each once, in order: the result's, after the call's own."""
    out: list[dict[str, Any]] = []
    for step in result.steps:
        out += [w for w in step.get("warnings") or [] if w not in out]
    return out


def failed_json(error: BaseException, warnings: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The result of a run that raised: the partial result when the error carries one."""
    partial = getattr(error, "result", None)
    if not isinstance(partial, RunResult):
        usage = {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0}
        partial = RunResult("", "", "error", [], None, usage, [], [])
    out = result_json(partial, warnings)
    if out["runId"] == "":
        out["runId"] = None
    out["status"] = "failed"
    out["finishReason"] = "error"
    out["error"] = str(error)
    return out


def wire_chunk(chunk: Chunk, run_id: str, warnings: StreamWarnings | None = None) -> Chunk:
    """A chunk as the reference server streams it: ``runId`` and ``from: "AGENT"`` added.

    ``step-finish`` and ``finish`` also get ``payload.stepResult.reason`` (where the
    reference client reads the finish reason), besides the ``finishReason`` we send, and
    ``payload.stepResult.warnings`` when the stream's `warnings` has any (`StreamWarnings`).
    """
    out = {**chunk, "runId": run_id, "from": "AGENT"}
    if chunk.get("type") in ("finish", "step-finish"):
        payload = dict(chunk.get("payload") or {})
        step = dict(payload.get("stepResult") or {"reason": payload.get("finishReason", "stop")})
        if warnings is not None and warnings.all:
            step["warnings"] = warnings.all
        payload["stepResult"] = step
        out["payload"] = payload
    return out


class StreamWarnings:
    """What a stream's run did not apply, as its ``step-finish`` and ``finish`` chunks carry it
    (`wire_chunk`): in ``payload.stepResult.warnings``, where the reference's stream has them
    and its client's result takes them from (the last ``step-finish``'s). The call's own warnings
    (`calls.AgentCall.warnings`; none for a resumed or observed run, which has no options of its
    own), then its model calls' so far, gathered from each ``step-start`` (`see`), each once: at
    the end, the generate result's ``warnings``. One per stream."""

    def __init__(self, own: list[dict[str, Any]] | None = None) -> None:
        self.own = list(own or [])
        self.model: list[dict[str, Any]] = []
        """The model calls' warnings seen so far (`model_warnings` for a whole result)."""

    def see(self, chunk: Chunk) -> list[dict[str, Any]]:
        """Note a chunk on its way: the model warnings its ``step-start`` adds (each once)."""
        if chunk.get("type") != "step-start":
            return []
        new = [w for w in (chunk.get("payload") or {}).get("warnings") or [] if w not in self.model]
        self.model += new
        return new

    @property
    def all(self) -> list[dict[str, Any]]:
        """The call's own warnings, then its model calls' so far."""
        return [*self.own, *self.model]


_DELTAS = {"text-delta": "text", "reasoning-delta": "reasoning"}


class Framing:
    """The reference's framing of a stream's deltas, added on the wire: each block of
    ``text-delta`` (``reasoning-delta``) chunks with one id opens with ``text-start`` and closes
    with ``text-end`` (``reasoning-*``) before the next chunk that is not one of them (custom
    ``data-*`` chunks stay inside), which converting to AI SDK UI streams relies on. One per
    connection: a client reattaching mid-block gets its start again. A stream that frames its
    blocks itself is passed as it is."""

    def __init__(self) -> None:
        self._open: tuple[str, Any] | None = None

    def frame(self, chunk: Chunk) -> list[Chunk]:
        """`chunk`, with the framing chunks that go before it."""
        kind = str(chunk.get("type"))
        block_id = (chunk.get("payload") or {}).get("id")
        block, _, edge = kind.rpartition("-")
        if kind in _DELTAS:
            if self._open == (_DELTAS[kind], block_id):
                return [chunk]
            framing = self.close()
            self._open = (_DELTAS[kind], block_id)
            return [*framing, {"type": f"{self._open[0]}-start", "payload": {"id": block_id}}, chunk]
        if block in ("text", "reasoning") and edge in ("start", "end"):
            framing = [] if self._open == (block, block_id) else self.close()
            self._open = (block, block_id) if edge == "start" else None
            return [*framing, chunk]
        return [chunk] if kind.startswith("data-") else [*self.close(), chunk]

    def close(self) -> list[Chunk]:
        """The end of the open block, if one is (before any other chunk, and at the stream's end)."""
        if self._open is None:
            return []
        (block, block_id), self._open = self._open, None
        return [{"type": f"{block}-end", "payload": {"id": block_id}}]


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


def dumps(value: Any) -> str:
    """Compact JSON; bytes (inline file data) as base64."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_json_default)
