"""The run's message list (MastraDBMessage dicts with their source), signals, and the provider prompt."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from procmesh.parts import part_provenance
from procmesh_orchestrator.run import attachments

Message = dict[str, Any]

INPUT = "input"
MEMORY = "memory"
RESPONSE = "response"
CONTEXT = "context"

_DEFAULT_TAGS = {
    "reactive": "system-reminder",
    "system-reminder": "system-reminder",
    "user-message": "user",
    "user": "user",
    "notification": "notification",
    "state": "state",
}
_CANONICAL_TYPES = {"system-reminder": "reactive", "user-message": "user"}


def now_iso() -> str:
    """The current time as the reference's ISO timestamp."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_id() -> str:
    """A fresh message id."""
    return str(uuid.uuid4())


def text_message(role: str, text: str, *, msg_id: str | None = None) -> Message:
    """A message holding one text part."""
    return {
        "id": msg_id or new_id(),
        "role": role,
        "createdAt": now_iso(),
        "content": {"format": 2, "parts": [{"type": "text", "text": text}]},
    }


def message_text(msg: Message) -> str:
    """The text parts of a message joined with newlines."""
    content = msg.get("content") or {}
    if isinstance(content, str):
        return content
    if not any(p.get("type") == "text" for p in content.get("parts") or []):  # the legacy flat form
        flat = content.get("content")
        return flat if isinstance(flat, str) else ""
    return "\n".join(p.get("text", "") for p in content.get("parts") or [] if p.get("type") == "text")


class RunMessages:
    """The live conversation of one run: messages in order, each tagged with its source.

    Messages are kept in an insertion-ordered dict by id, so adding, replacing in place and
    removing are O(1) and a hook's array return is applied in linear time (a list rebuilt per
    known id made 20,000 messages take 15 s on the event loop).
    """

    def __init__(self) -> None:
        self._by_id: dict[str, Message] = {}
        self.sources: dict[str, str] = {}

    @property
    def items(self) -> list[Message]:
        """The messages, in order (a new list)."""
        return list(self._by_id.values())

    def add(self, msg: Message, source: str) -> None:
        """Append a message (a message with the same id is replaced in place)."""
        msg_id = msg.setdefault("id", new_id())
        self._by_id[msg_id] = msg  # an existing key keeps its position
        self.sources[msg_id] = source

    def get(self, msg_id: str) -> Message:
        """The message with this id (KeyError when there is none)."""
        return self._by_id[msg_id]

    def dump(self) -> list[tuple[Message, str]]:
        """(message, source) in order: what a suspended run's snapshot keeps."""
        return [(m, self.sources[i]) for i, m in self._by_id.items()]

    def prepend(self, messages: list[Message], source: str) -> None:
        """Put `messages` ahead of every message (loaded history goes before the call's input).

        A message whose id is already here (a client resending stored history) keeps one place:
        the earlier one, with `source`.
        """
        rest = self._by_id
        self._by_id = {}
        for msg in messages:
            msg_id = msg.setdefault("id", new_id())
            self._by_id[msg_id] = msg
            self.sources[msg_id] = source
        for msg_id, msg in rest.items():
            self._by_id.setdefault(msg_id, msg)

    def view(self, *sources: str) -> list[Message]:
        """Messages of the given sources (all when none given)."""
        if not sources:
            return self.items
        return [m for i, m in self._by_id.items() if self.sources.get(i) in sources]

    def apply(self, before: list[Message], returned: list[Message], default_source: str) -> list[Message]:
        """Apply an array-style hook return over the view `before`.

        Ids in `before` missing from `returned` are removed; known ids are
        replaced in place; new messages are appended with `default_source`.
        System-role messages are not conversation: they are returned for the
        caller to add to the system messages.
        """
        keep = {m.get("id") for m in returned}
        for msg in before:
            if msg["id"] not in keep:
                self.remove(msg["id"])
        systems = []
        for msg in returned:
            if msg.get("role") == "system":
                systems.append(msg)
                if msg.get("id") in self.sources:
                    self.remove(msg["id"])
                continue
            self.add(msg, self.sources.get(msg.get("id", ""), default_source))
        return systems

    def replace_all(self, returned: list[Message], default_source: str) -> list[Message]:
        """Replace the whole list (message_list edits); returns system-role messages."""
        return self.apply(self.items, returned, default_source)

    def settle_tool_calls(self, results: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
        """Put tool results (a client tool's, sent back by the caller) into the assistant
        message that made each call, newest first; the results that matched no call.

        A settled message takes `source`, so a message loaded from memory is saved again (in
        place, by id) with its result.
        """
        left = []
        for result in results:
            call_id = result.get("toolCallId")
            for msg_id, msg in reversed(self._by_id.items()):
                if msg.get("role") != "assistant":
                    continue
                parts = (msg.get("content") or {}).get("parts") or []
                invocations = [p["toolInvocation"] for p in parts if p.get("type") == "tool-invocation"]
                invocation = next((i for i in invocations if i.get("toolCallId") == call_id), None)
                if invocation is not None:
                    invocation.update(state="result", result=result.get("result"))
                    if result.get("modelOutput") is not None:  # a client tool's toModelOutput
                        keep_model_output(msg, str(call_id), result["modelOutput"])
                    self.sources[msg_id] = source
                    break
            else:
                left.append(result)
        return left

    def merge_resent_calls(self) -> None:
        """Drop an input assistant message whose tool calls a loaded message already holds (a
        client resending its model's answer, without ids, with a thread): its results settle the
        loaded message instead, so the turn is stored once (the reference merges it likewise)."""
        loaded: dict[str, tuple[str, dict[str, Any]]] = {}
        for msg_id, msg in self._by_id.items():
            if msg.get("role") == "assistant" and self.sources[msg_id] == MEMORY:
                loaded.update((str(i.get("toolCallId")), (msg_id, i)) for i in _invocations(msg))
        for msg_id, msg in list(self._by_id.items()):
            invocations = _invocations(msg) if msg.get("role") == "assistant" else []
            if self.sources[msg_id] != INPUT or not invocations:
                continue
            if any(str(i.get("toolCallId")) not in loaded for i in invocations):
                continue
            for invocation in invocations:
                target_id, target = loaded[str(invocation.get("toolCallId"))]
                if invocation.get("state") == "result":
                    target.update(state="result", result=invocation.get("result"))
                    self.sources[target_id] = INPUT
            self.remove(msg_id)

    def remove(self, msg_id: str) -> None:
        """Remove a message by id."""
        if msg_id in self.sources:
            del self.sources[msg_id]
            del self._by_id[msg_id]

    def add_signal(self, signal: dict[str, Any]) -> tuple[Message, dict[str, Any]]:
        """Add a signal as a ``role: signal`` message; returns it and its data-signal payload."""
        record = signal_record(signal)
        return self.add_signal_record(record), signal_data(record)

    def add_signal_record(self, record: dict[str, Any]) -> Message:
        """Add a signal already given its id and time (`signal_record`) as a ``role: signal`` message.

        A transient signal replaces an earlier transient copy with the same
        type, tag and contents (so re-sending each step keeps one copy at the end).
        """
        info = {k: v for k, v in record.items() if k != "contents"}
        contents = record["contents"]
        if info.get("transient"):
            for msg in self.view():
                meta = (msg.get("content") or {}).get("metadata", {}).get("signal")
                if (
                    msg.get("role") == "signal"
                    and meta
                    and meta.get("transient")
                    and meta.get("type") == info["type"]
                    and meta.get("tagName") == info["tagName"]
                    and message_text(msg) == contents
                ):
                    self.remove(msg["id"])
        msg = {
            "id": new_id(),
            "role": "signal",
            "type": info["tagName"],
            "createdAt": info["createdAt"],
            "content": {
                "format": 2,
                "parts": [{"type": "text", "text": contents}],
                "metadata": {"signal": info},
            },
        }
        self.add(msg, INPUT)
        return msg


def _invocations(msg: Message) -> list[dict[str, Any]]:
    parts = (msg.get("content") or {}).get("parts") or []
    return [p["toolInvocation"] for p in parts if p.get("type") == "tool-invocation"]


def signal_record(signal: dict[str, Any]) -> dict[str, Any]:
    """A signal as the run records it: id, time, canonical type and tag fixed, its contents alongside.

    Made where the signal is announced (an output-stream stage announces it as a chunk before
    the run adds it), so the data-signal chunk and the message agree.
    """
    kind = signal.get("type", "reactive")
    record: dict[str, Any] = {
        "id": signal.get("id") or new_id(),
        "type": _CANONICAL_TYPES.get(kind, kind),
        "tagName": signal.get("tagName") or _DEFAULT_TAGS.get(kind, kind),
        "createdAt": now_iso(),
    }
    if signal.get("attributes"):
        record["attributes"] = dict(signal["attributes"])
    if signal.get("metadata"):
        record["metadata"] = signal["metadata"]
    if signal.get("transient", False):
        record["transient"] = True
    record["contents"] = signal.get("contents", "")
    return record


def signal_data(record: dict[str, Any]) -> dict[str, Any]:
    """The payload of the data-signal chunk announcing a signal record."""
    return {k: v for k, v in record.items() if k != "metadata"}


def _escape(text: str, quote: bool = False) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace('"', "&quot;") if quote else text


def _attr_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    return json.dumps(value, separators=(",", ":"))


def render_signal(msg: Message) -> str:
    """How the model sees a signal: ``<tag k="v">contents</tag>``."""
    info = msg["content"]["metadata"]["signal"]
    contents = message_text(msg)
    if info.get("type") == "user" and not info.get("attributes"):
        return contents
    attrs = "".join(
        f' {name}="{_escape(_attr_value(value), quote=True)}"'
        for name, value in (info.get("attributes") or {}).items()
        if value is not None
    )
    tag = info["tagName"]
    if not contents:
        return f"<{tag}{attrs} />"
    return f"<{tag}{attrs}>{_escape(contents)}</{tag}>"


def model_output(part: dict[str, Any]) -> Any:
    """What the model sees of a tool part's result when its tool mapped it (toModelOutput), kept
    where the reference keeps it (``providerMetadata.mastra.modelOutput``); None when it has none."""
    meta = part.get("providerMetadata")
    mastra = meta.get("mastra") if isinstance(meta, dict) else None
    return mastra.get("modelOutput") if isinstance(mastra, dict) else None


def _prompt_output(part: dict[str, Any], invocation: dict[str, Any]) -> Any:
    """What the prompt shows of a tool part's result: its model output, else the result."""
    shown = model_output(part)
    return invocation.get("result") if shown is None else shown


def keep_model_output(message: Message, call_id: str, value: Any) -> None:
    """Keep a tool's model output on its call's part of `message`: the prompt shows it, the stored
    message and the caller keep the result."""
    for part in (message.get("content") or {}).get("parts") or []:
        if part.get("type") == "tool-invocation" and part["toolInvocation"].get("toolCallId") == call_id:
            meta = part.setdefault("providerMetadata", {})
            meta.setdefault("mastra", {})["modelOutput"] = value


def build_prompt(
    system_messages: list[Message], messages: list[Message], *, user_first: bool = True
) -> list[dict[str, Any]]:
    """The provider-shaped prompt: system messages first, then the conversation (which, with
    `user_first`, starts with a user turn).

    A tool call without a result (a client's unanswered call, an aborted run's) is left out, as
    the reference leaves it out (`sanitizeV5UIMessages`): a provider rejects a call with no result
    after it. A provider-executed one stays on the open turn only (`_open_turn`), where the
    provider may still answer it. An assistant message left with nothing is left out whole.
    """
    prompt: list[dict[str, Any]] = [
        {"role": "system", "content": message_text(m)} for m in system_messages if message_text(m)
    ]
    open_turn, open_content = _open_turn(messages)
    for index, msg in enumerate(messages):
        role = msg.get("role")
        parts = (msg.get("content") or {}).get("parts") or []
        if role == "signal":
            prompt.append({"role": "user", "content": [{"type": "text", "text": render_signal(msg)}]})
        elif role == "user":
            content = [_user_part(p) for p in parts if p.get("type") in ("text", "file", "image")]
            prompt.append({"role": "user", "content": attachments.with_placeholders(msg, content)})
        elif role == "assistant":
            parts_out, results = open_content if index == open_turn else _assistant_turn(parts, False)
            if parts_out:
                prompt.append({"role": "assistant", "content": parts_out})
            if results:
                prompt.append({"role": "tool", "content": results})
    # A conversation starts with a user turn: a history window that starts with an answer gets a
    # placeholder question before it (the reference's rule).
    first = next((m for m in prompt if m["role"] != "system"), None)
    if user_first and first is not None and first["role"] == "assistant":
        prompt.insert(prompt.index(first), {"role": "user", "content": [{"type": "text", "text": "."}]})
    return prompt


def _open_turn(messages: list[Message]) -> tuple[int, tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """The index of the open turn and its prompt content (`_assistant_turn`'s, converted once):
    the last assistant message that shows the model anything, when no user turn (a signal is
    one) follows it; -1 and nothing when there is none. Only there may a provider-executed call
    be left without its result (the provider may defer it to its next request); anywhere else
    such a call is an orphan (the reference's rule)."""
    for index in range(len(messages) - 1, -1, -1):
        msg = messages[index]
        role = msg.get("role")
        if role in ("user", "signal"):
            break
        if role == "assistant":
            content = _assistant_turn((msg.get("content") or {}).get("parts") or [], True)
            if any(content):
                return index, content
    return -1, ([], [])


def _assistant_turn(
    parts: list[dict[str, Any]], open_turn: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """An assistant message's prompt content and its tool results. A call with neither a result
    nor an error is left out, but for a provider-executed call on the open turn."""
    parts_out: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for part in parts:
        kind = part.get("type")
        if kind == "text" and part.get("text"):
            parts_out.append({"type": kind, "text": part["text"]})
        elif kind == "reasoning" and part.get("text"):
            parts_out.append({"type": kind, "text": part["text"], **part_provenance(part)})
        elif kind == "tool-invocation":
            inv = part["toolInvocation"]
            state = inv.get("state")
            provenance = part_provenance(part, inv)
            if state not in ("result", "output-error") and not (
                open_turn and provenance.get("providerExecuted")
            ):
                continue
            parts_out.append(
                {
                    "type": "tool-call",
                    "toolCallId": inv["toolCallId"],
                    "toolName": inv["toolName"],
                    "input": inv.get("args"),
                    **provenance,
                }
            )
            if state == "result":
                results.append(
                    {
                        "type": "tool-result",
                        "toolCallId": inv["toolCallId"],
                        "toolName": inv["toolName"],
                        "output": _prompt_output(part, inv),
                        **provenance,
                    }
                )
            elif state == "output-error":  # the model sees why the call failed
                results.append(
                    {
                        "type": "tool-result",
                        "toolCallId": inv["toolCallId"],
                        "toolName": inv["toolName"],
                        "output": inv.get("errorText", ""),
                        "isError": True,
                    }
                )
    return parts_out, results


def _user_part(part: dict[str, Any]) -> dict[str, Any]:
    if part.get("type") == "text":
        return {"type": "text", "text": part.get("text", "")}
    out = {
        "type": "file",
        "mediaType": part.get("mediaType") or part.get("mimeType", ""),
        "data": part.get("data", part.get("url", part.get("image", ""))),
    }
    if part.get("filename"):  # the name an unavailable attachment's placeholder gives
        out["filename"] = part["filename"]
    return out
