"""Results and chunks in the reference server's shapes (camelCase), as the HTTP API sends them and
the CLI prints them; the gRPC API's proto twins (`service.grpc.responses`) take the same calls and
results from `all_calls` and `all_results`."""

from __future__ import annotations

import base64
import json
from typing import Any

from procmesh_orchestrator.run import RunResult

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


def result_json(result: RunResult) -> dict[str, Any]:
    """The generate() result as the reference server returns it (camelCase), with `status`.

    ``toolCalls`` holds every step's calls as ``tool-call`` chunks (the client runs those of its
    client tools at finish reason ``tool-calls``; ``response.messages`` are then AI SDK model
    messages, the stored form in ``response.dbMessages``), the one awaiting approval last
    (finish reason ``suspended``, also as ``suspendPayload``); ``toolResults`` their results as
    ``tool-result`` chunks. Each step's ``toolCalls`` are chunks too.
    """
    response: dict[str, Any] = {"messages": result.response_messages}
    if result.finish_reason == "tool-calls" and result.steps and result.status != "suspended":
        response = {
            "messages": model_messages(result.response_messages),
            "dbMessages": result.response_messages,
        }
    response["modelId"] = result.model_id  # the model that answered (a fallback, when one did)
    run_id = result.run_id
    steps = [{**s, "toolCalls": _call_chunks(s.get("toolCalls") or [], run_id)} for s in result.steps]
    out: dict[str, Any] = {
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
        "object": result.object,
    }
    if result.status == "suspended" and result.suspended:
        first = result.suspended[0]
        out["suspendPayload"] = {k: first.get(k) for k in ("toolCallId", "toolName", "args")}
    if result.error is not None:
        out["error"] = result.error
    return out


def failed_json(error: BaseException) -> dict[str, Any]:
    """The result of a run that raised: the partial result when the error carries one."""
    partial = getattr(error, "result", None)
    if isinstance(partial, RunResult):
        out = result_json(partial)
    else:
        out = {
            "runId": None,
            "text": "",
            "finishReason": "error",
            "steps": [],
            "usage": {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
            "tripwire": None,
            "totalUsage": {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
            "toolCalls": [],
            "toolResults": [],
            "messages": [],
            "response": {"messages": []},
            "violations": [],
            "traceId": None,
            "object": None,
        }
    out["status"] = "failed"
    out["finishReason"] = "error"
    out["error"] = str(error)
    return out


def wire_chunk(chunk: Chunk, run_id: str) -> Chunk:
    """A chunk as the reference server streams it: ``runId`` and ``from: "AGENT"`` added.

    ``step-finish`` and ``finish`` also get ``payload.stepResult.reason`` (where the
    reference client reads the finish reason), besides the ``finishReason`` we send.
    """
    out = {**chunk, "runId": run_id, "from": "AGENT"}
    if chunk.get("type") in ("finish", "step-finish"):
        payload = dict(chunk.get("payload") or {})
        payload.setdefault("stepResult", {"reason": payload.get("finishReason", "stop")})
        out["payload"] = payload
    return out


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


def dumps(value: Any) -> str:
    """Compact JSON; bytes (inline file data) as base64."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_json_default)
