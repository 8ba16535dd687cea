"""Input messages as both APIs and the memory API take them, as the run's MastraDBMessage dicts.

A message may be a string, ``{role, content}`` (a string, text and file parts, or a stored
message's content), an AI SDK model message (an assistant's tool-call parts, a ``tool`` message's
tool-result parts) or a UI message (``parts`` with v4 ``tool-invocation`` or v5 / v6 ``tool-<name>``
parts): what @mastra/client-js sends, including to go on after a client tool. A malformed one is a 400 naming
where it is (``messages.2.content.0``); so is a key its shape does not take, and the keys taken but
not applied go to `ignored` (`message_keys`).
"""

from __future__ import annotations

from typing import Any

from procmesh import convert
from procmesh.parts import with_flat_text
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run.tool_calls import DECLINED
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import BadRequestError
from procmesh_orchestrator.service.api import message_keys as mk

ROLES = ("user", "assistant", "system")

Ignored = list[tuple[mk.Keys, str]] | None
"""Where the keys a message holds that procmesh takes but does not apply go (None: not noted)."""


def _with_id(message: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """`message` under the item's own id, when it gives one (`own_ids` decides whether it stays)."""
    if isinstance(item.get("id"), str) and item["id"]:
        message["id"] = item["id"]
    return message


def db_message(item: str | dict[str, Any], where: str, ignored: Ignored = None) -> dict[str, Any]:
    """One input message as a MastraDBMessage dict; raises BadRequestError naming `where`."""
    if isinstance(item, str):
        return msgs.text_message("user", item)
    role = item.get("role", "user")
    if role not in ROLES:
        raise BadRequestError(f"{where}.role: must be one of {', '.join(ROLES)}, got {role!r}")
    content = item.get("content")
    if isinstance(content, dict):  # a MastraDBMessage (format 2); only `content.content`: its text
        return _stored(item, role, content, where, ignored)
    mk.check(item, where, mk.MODEL_MESSAGE, ignored)
    if isinstance(content, str):
        return _with_id(msgs.text_message(role, content), item)
    if isinstance(content, list):
        parts: list[dict[str, Any]] = []
        for i, part in enumerate(content):
            at = f"{where}.content.{i}"
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                mk.check(part, at, mk.TEXT, ignored)
                parts.append({"type": "text", "text": part["text"]})
            elif isinstance(part, dict) and part.get("type") in _FILE_PARTS and role == "user":
                parts.append(_file_part(part, at, ignored))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                allowed = "text, image, file" if role == "user" else "text parts {type, text}"
                raise BadRequestError(f"{at}: unsupported part {kind!r} ({allowed} only)")
        message = msgs.text_message(role, "")
        message["content"]["parts"] = parts
        return _with_id(message, item)
    raise BadRequestError(f"{where}.content: must be a string, a list of text parts or a message content")


def _stored(
    item: dict[str, Any], role: str, content: dict[str, Any], where: str, ignored: Ignored
) -> dict[str, Any]:
    """A MastraDBMessage, kept as given once its keys are its type's (`message_keys.DB_*`)."""
    mk.check(item, where, mk.DB_MESSAGE, ignored)
    mk.check(content, f"{where}.content", mk.DB_CONTENT, ignored)
    for i, part in enumerate(content.get("parts") or []):
        keys = mk.db_part_keys(part.get("type")) if isinstance(part, dict) else None
        if keys is None:  # not a part, or a type the contract's conversion refuses below
            continue
        at = f"{where}.content.parts.{i}"
        mk.check(part, at, keys, ignored)
        if isinstance(part.get("toolInvocation"), dict):
            mk.check(part["toolInvocation"], f"{at}.toolInvocation", mk.DB_INVOCATION, ignored)
    content = {**content, "parts": with_flat_text(content)}
    message = {**item, "role": role, "id": item.get("id") or msgs.new_id(), "content": content}
    try:
        convert.message_to_proto(message)
    except (ValueError, TypeError, AttributeError) as exc:
        raise BadRequestError(f"{where}.content: {exc}") from None
    return message


_FILE_PARTS = ("image", "file")
_IMAGE_MAGIC = {"/9j/": "image/jpeg", "iVBOR": "image/png", "R0lGOD": "image/gif", "UklGR": "image/webp"}


def _file_part(part: dict[str, Any], where: str, ignored: Ignored = None) -> dict[str, Any]:
    """An image or file part (AI SDK model or UI message, either version) as the run's file part
    ``{type: "file", mediaType, data, filename?}``; ``data`` is a URL, a data URL or base64."""
    kind = part["type"]
    mk.check(part, where, mk.IMAGE if kind == "image" else mk.FILE, ignored)
    keys = ("image", "url", "data") if kind == "image" else ("data", "url")
    data = next((part[k] for k in keys if isinstance(part.get(k), str) and part[k]), None)
    if data is None:
        raise BadRequestError(f"{where}: a {kind} part needs {' or '.join(keys)} (a URL or base64)")
    media = part.get("mediaType") or part.get("mimeType")
    if not media and data.startswith("data:"):
        media = data[5:].partition(";")[0].partition(",")[0]
    if not media and kind == "image":
        if data.startswith(("http://", "https://")):
            media = "image/*"
        else:
            media = next((t for magic, t in _IMAGE_MAGIC.items() if data.startswith(magic)), None)
    if not isinstance(media, str) or not media:
        raise BadRequestError(f"{where}: a {kind} part needs its mediaType (mimeType)")
    out = {"type": "file", "mediaType": media, "data": data}
    if isinstance(part.get("filename"), str) and part["filename"]:
        out["filename"] = part["filename"]
    return out


def _attachments(item: dict[str, Any], role: str, where: str) -> list[dict[str, Any]]:
    """A v4 UI message's ``experimental_attachments`` (``[{url, contentType?, name?}]``) as file
    parts, as the AI SDK puts them in the prompt: a user message's only."""
    raw = item.get("experimental_attachments")
    if raw is None:
        return []
    at = f"{where}.experimental_attachments"
    if role != "user" or not isinstance(raw, list):
        raise BadRequestError(f"{at}: a user message's list of {{url, contentType?, name?}}")
    parts = []
    for i, attachment in enumerate(raw):
        if not isinstance(attachment, dict):
            raise BadRequestError(f"{at}.{i}: must be an object {{url, contentType?, name?}}")
        mk.check(attachment, f"{at}.{i}", mk.ATTACHMENT, None)
        file = {"type": "file", "data": attachment.get("url"), "mediaType": attachment.get("contentType")}
        parts.append(_file_part({**file, "filename": attachment.get("name")}, f"{at}.{i}"))
    return parts


def _unwrap_output(output: Any) -> Any:
    """An AI SDK tool-result ``output`` (``{type: "json" | "text" | ..., value}``) as its value."""
    if isinstance(output, dict) and isinstance(output.get("type"), str) and "value" in output:
        return output["value"]
    return output


def _tool_result(part: dict[str, Any], where: str, ignored: Ignored) -> dict[str, Any]:
    """A client tool's result; its ``providerOptions.mastra.modelOutput`` (the tool's toModelOutput,
    which @mastra/client-js runs) is what the prompt shows of it, as the reference server does."""
    mk.check(part, where, mk.TOOL_RESULT, ignored)
    call_id, name = part.get("toolCallId"), part.get("toolName")
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise BadRequestError(f"{where}: a tool-result needs toolCallId and toolName strings")
    result = part["result"] if "result" in part else _unwrap_output(part.get("output"))
    out = {"type": "tool-result", "toolCallId": call_id, "toolName": name, "result": result}
    options = part.get("providerOptions")
    mastra = options.get("mastra") if isinstance(options, dict) else None
    if isinstance(mastra, dict) and mastra.get("modelOutput") is not None:
        out["modelOutput"] = mastra["modelOutput"]
    beside = set(options) - {"mastra"} if isinstance(options, dict) else set()
    if isinstance(options, dict) and "mastra" in options:
        beside |= set(mastra) - {"modelOutput"} if isinstance(mastra, dict) else {"mastra"}
    if beside and ignored is not None:  # provider options beside the model output: not applied
        ignored.append((mk.TOOL_RESULT_OPTIONS, "providerOptions"))
    return out


def _invocation(
    call_id: Any, name: Any, args: Any, where: str, part: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """A tool call as the run's tool-invocation part, with the part's provenance (`providerExecuted`,
    and a UI part's `providerMetadata`: the provider, a tool's model output) when it has one."""
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise BadRequestError(f"{where}: a tool call needs toolCallId and toolName strings")
    out: dict[str, Any] = {
        "type": "tool-invocation",
        "toolInvocation": {"state": "call", "toolCallId": call_id, "toolName": name, "args": args, **extra},
    }
    if part.get("providerExecuted") is True:
        out["providerExecuted"] = True
    if isinstance(part.get("providerMetadata"), dict) and part["providerMetadata"]:
        out["providerMetadata"] = part["providerMetadata"]
    return out


def _format2(role: str, parts: list[dict[str, Any]], item: dict[str, Any]) -> dict[str, Any]:
    message = msgs.text_message(role, "")
    message["content"]["parts"] = parts
    return _with_id(message, item)


_NO_APPROVAL = (
    "procmesh's messages hold no approval state, which the reference keeps and leaves out of the "
    "prompt; answer a call awaiting approval with approve-tool-call / decline-tool-call"
)
_APPROVAL_PARTS = ("tool-approval-request", "tool-approval-response")
"""AI SDK v6 model message parts: an assistant's request for a call's approval, a tool message's answer."""

_DROPPED_UI_PARTS = ("step-start", "reasoning", "source")
"""UI parts that carry nothing the run reads back (the reference drops them from the prompt too)."""


def _ui_tool(part: dict[str, Any], at: str, ignored: Ignored) -> dict[str, Any]:
    """A v4 UI ``tool-invocation`` part in state ``call`` or ``result``."""
    mk.check(part, at, mk.UI_TOOL, ignored)
    inv = part["toolInvocation"]
    mk.check(inv, f"{at}.toolInvocation", mk.UI_INVOCATION, ignored)
    part = {**{k: inv[k] for k in ("providerExecuted", "providerMetadata") if k in inv}, **part}
    state = inv.get("state")
    if state == "call":
        return _invocation(inv.get("toolCallId"), inv.get("toolName"), inv.get("args"), at, part)
    if state == "result" and "result" in inv:
        return _invocation(
            inv.get("toolCallId"),
            inv.get("toolName"),
            inv.get("args"),
            at,
            part,
            state="result",
            result=inv["result"],
        )
    raise BadRequestError(f"{at}.toolInvocation.state: must be 'call' or 'result' (with a result)")


_UNHONOURED_V5_STATES = {
    "input-streaming": "a call whose input is still streaming (partial): procmesh would hand the "
    "model and processors a call as if its input were whole",
    "approval-requested": _NO_APPROVAL,
    "approval-responded": _NO_APPROVAL,
}
"""The v5 / v6 UI tool states procmesh refuses, and why (docs/service.md, "Keys inside a message")."""


def _ui_tool_v5(part: dict[str, Any], kind: str, at: str, ignored: Ignored) -> dict[str, Any]:
    """An AI SDK v5 / v6 UI tool part (``tool-<name>``, ``dynamic-tool``) as the run's tool-invocation
    part, as the reference's ``AIV5Adapter.fromUIMessage`` converts it: ``input-available`` a call,
    ``output-available`` a result (an output object's ``value`` if it has one), ``output-error`` a
    failed call (its ``errorText``, and ``rawInput`` kept); ``output-denied`` a declined call, whose
    result is the approval's reason (what the reference's prompt shows, and procmesh's own declined
    calls hold)."""
    mk.check(part, at, mk.UI_V5_TOOL, ignored)
    name = part.get("toolName") if kind == "dynamic-tool" else kind.removeprefix("tool-")
    call_id, args, state = part.get("toolCallId"), part.get("input"), part.get("state")
    origin = {
        "providerExecuted": part.get("providerExecuted"),
        "providerMetadata": part.get("callProviderMetadata"),
    }
    if state == "input-available":
        return _invocation(call_id, name, args, at, origin)
    if state == "output-available" and "output" in part:
        output = part["output"]
        result = output["value"] if isinstance(output, dict) and "value" in output else output
        return _invocation(call_id, name, args, at, origin, state="result", result=result)
    if state == "output-error" and isinstance(part.get("errorText"), str):
        raw = {"rawInput": part["rawInput"]} if part.get("rawInput") is not None else {}
        return _invocation(
            call_id, name, args, at, origin, state="output-error", errorText=part["errorText"], **raw
        )
    if state == "output-denied":
        approval = part.get("approval")
        reason = approval.get("reason") if isinstance(approval, dict) else None
        result = reason if isinstance(reason, str) and reason else DECLINED
        return _invocation(call_id, name, args, at, origin, state="result", result=result)
    if state in _UNHONOURED_V5_STATES:
        raise BadRequestError(f"{at}.state: {state!r} is not taken: {_UNHONOURED_V5_STATES[state]}")
    raise BadRequestError(
        f"{at}.state: must be input-available, output-available (with an output), output-error (with "
        f"an errorText string) or output-denied, got {state!r}"
    )


def _is_v5_tool(kind: str) -> bool:
    return kind == "dynamic-tool" or (kind.startswith("tool-") and kind != "tool-invocation")


def _ui_message(item: dict[str, Any], role: str, where: str, ignored: Ignored) -> dict[str, Any]:
    """A UI message ``{id, role, parts}`` (what the client keeps of a streamed answer)."""
    mk.check(item, where, mk.UI_MESSAGE, ignored)
    if "content" in item and not isinstance(item["content"], str):
        raise BadRequestError(f"{where}.content: a UI message's content is its text (a string)")
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(item["parts"]):
        at = f"{where}.parts.{i}"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(part, dict) or not isinstance(kind, str):
            raise BadRequestError(f"{at}: must be an object with a type")
        if kind == "text" and isinstance(part.get("text"), str):
            mk.check(part, at, mk.UI_TEXT, ignored)
            parts.append({"type": "text", "text": part["text"]})
        elif (
            kind == "tool-invocation" and role == "assistant" and isinstance(part.get("toolInvocation"), dict)
        ):
            parts.append(_ui_tool(part, at, ignored))
        elif _is_v5_tool(kind) and role == "assistant":
            parts.append(_ui_tool_v5(part, kind, at, ignored))
        elif kind in _FILE_PARTS and role == "user":
            parts.append(_file_part(part, at, ignored))
        elif kind in _DROPPED_UI_PARTS:
            continue
        else:
            raise BadRequestError(
                f"{at}: unsupported part {kind!r} (text, file, tool-invocation, tool-<name>)"
            )
    return _format2(role, parts + _attachments(item, role, where), item)


def _model_message(item: dict[str, Any], role: str, where: str, ignored: Ignored) -> dict[str, Any]:
    """An AI SDK model message with a list content: text, and for the assistant tool-call parts;
    a ``tool`` message's tool-result parts."""
    mk.check(item, where, mk.MODEL_MESSAGE, ignored)
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(item["content"]):
        at = f"{where}.content.{i}"
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if not isinstance(part, dict):
            raise BadRequestError(f"{at}: unsupported part {kind!r}")
        if kind in _APPROVAL_PARTS:
            raise BadRequestError(f"{at}: a {kind} part is not taken: {_NO_APPROVAL}")
        if role == "tool":
            if kind != "tool-result":
                raise BadRequestError(f"{at}: a tool message holds tool-result parts only, got {kind!r}")
            parts.append(_tool_result(part, at, ignored))
        elif kind == "text" and isinstance(part.get("text"), str):
            mk.check(part, at, mk.TEXT, ignored)
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "tool-call" and role == "assistant":
            mk.check(part, at, mk.TOOL_CALL, ignored)
            args = part["input"] if "input" in part else part.get("args")
            parts.append(_invocation(part.get("toolCallId"), part.get("toolName"), args, at, part))
        elif kind in _FILE_PARTS and role == "user":
            parts.append(_file_part(part, at, ignored))
        elif kind == "reasoning" and role == "assistant":
            continue
        else:
            allowed = "text, tool-call" if role == "assistant" else "text, image, file"
            raise BadRequestError(f"{at}: unsupported part {kind!r} ({allowed} only)")
    return _format2(role, parts, item)


def input_message(item: str | dict[str, Any], where: str, ignored: Ignored = None) -> dict[str, Any]:
    """One message of a generate / stream body: `db_message`'s shapes, plus what the client sends to
    go on after a client tool: AI SDK model messages (an assistant's tool-call parts, a ``tool``
    message's tool-result parts) and UI messages (``parts`` with tool parts)."""
    if isinstance(item, str):
        return db_message(item, where)
    role = item.get("role", "user")
    if isinstance(item.get("parts"), list) and not isinstance(item.get("content"), dict):
        if role not in ("user", "assistant"):
            raise BadRequestError(
                f"{where}.role: a UI message is from the user or the assistant, got {role!r}"
            )
        return _ui_message(item, role, where, ignored)
    if role == "tool":
        if not isinstance(item.get("content"), list) or not item["content"]:
            raise BadRequestError(f"{where}.content: a tool message holds a list of tool-result parts")
        return _model_message(item, role, where, ignored)
    if role in ("user", "assistant") and isinstance(item.get("content"), list):
        return _model_message(item, role, where, ignored)
    return db_message(item, where, ignored)


_CALLER_SET_IDS = ("threadId", "resourceId")


def own_ids(messages: list[dict[str, Any]], caller: Caller) -> None:
    """Set what the server decides on an input message: its thread and resource are the run's
    (a message's own are dropped, for every caller), and its id is a new one unless the caller is an
    operator (a trusted layer that keeps its ids).

    Like the run-level ids, these scope per-user data (memory, cache entries) that processors see.
    """
    for message in messages:
        for key in _CALLER_SET_IDS:
            message.pop(key, None)
        if not caller.operator or not message.get("id"):
            message["id"] = msgs.new_id()
