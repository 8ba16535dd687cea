"""The keys an input message and each of its parts may hold, by shape, and what procmesh does with
each: nothing in a message is ignored silently.

A shape's keys are the ones its real senders write, read from their type definitions
(``@mastra/core`` 1.68's MastraDBMessage, the AI SDK's v4 CoreMessage / UIMessage and v5-v7
ModelMessage / UIMessage) and from what ``@mastra/client-js`` 1.47 sends after a client tool. Each
key is read (`Keys.read`), accepted and not applied with its reason (`Keys.kept`: bookkeeping, a copy
of what is read, or kept with a stored message; `Keys.counted`: data a caller might expect applied,
counted by ``procmesh_message_keys_ignored_total{key}`` and named in a call's ``warnings``), or a 400
naming its path (``messages.2.content.0.foo: unknown key``). docs/service.md lists them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from procmesh_orchestrator.service._errors import BadRequestError
from procmesh_orchestrator.service._metrics import ServiceMetrics
from procmesh_orchestrator.store import label

log = logging.getLogger(__name__)

_PROVIDER_OPTIONS = "procmesh sends no per-message or per-part provider options to model providers"
_PROVIDER_METADATA = "provider metadata of an earlier answer: procmesh does not send it back to the model"
_CLIENT_SPANS = "@mastra/client-js's tracing of its client tool: procmesh traces with traceparent"
_IS_ERROR = "the model is sent the result as a plain one, without the mark: the reference engine drops it too"
"""A tool result's ``isError``: @mastra/core (1.71, the conformance oracle) sends such a result as
``{type: "text"}`` from a v4 CoreMessage (whose mark it does not store), a v4 UI invocation (whose
mark it keeps in the stored part) and a v5 ``error-text`` output alike (docs/service.md)."""
_STAMPED = "generate / stream stamp their own time (a memory save keeps it)"


@dataclass(frozen=True)
class Keys:
    """One shape's keys; `label` names the shape in errors and metric labels (a fixed name)."""

    label: str
    what: str
    read: frozenset[str]
    kept: Mapping[str, str] = field(default_factory=dict)
    counted: Mapping[str, str] = field(default_factory=dict)

    def reason(self, key: str) -> str:
        """Why an accepted key is not applied."""
        return self.counted.get(key) or self.kept[key]


def _keys(
    label: str,
    what: str,
    read: str,
    kept: Mapping[str, str] | None = None,
    counted: Mapping[str, str] | None = None,
) -> Keys:
    return Keys(label, what, frozenset(read.split()), dict(kept or {}), dict(counted or {}))


_MODEL_COUNTED = {"providerOptions": _PROVIDER_OPTIONS, "experimental_providerMetadata": _PROVIDER_OPTIONS}

MODEL_MESSAGE = _keys(
    "message",
    "a message {role, content}",
    "role content id threadId resourceId",
    {
        "createdAt": _STAMPED,
        "type": "MastraMessageV1's kind of message, which its content shows",
        "toolCallIds": "MastraMessageV1's copy of its tool-call parts",
        "toolCallArgs": "MastraMessageV1's copy of its tool-call parts",
        "toolNames": "MastraMessageV1's copy of its tool-call parts",
    },
    _MODEL_COUNTED,
)
UI_MESSAGE = _keys(
    "uiMessage",
    "a UI message {id, role, parts}",
    "role parts id threadId resourceId experimental_attachments",
    {
        "createdAt": _STAMPED,
        "content": "v4's copy of the text parts, which are read",
        "toolInvocations": "v4's copy of the tool-invocation parts, which are read",
        "reasoning": "v4's copy of the reasoning parts, which the prompt leaves out",
        "revisionId": "@mastra/client-js's revision of a streamed message",
    },
    {
        "annotations": "v4 message annotations are for the UI: the model does not see them",
        "metadata": "UI message metadata is for the UI: the model does not see it",
        "data": "v4's data-role payload: procmesh takes no data messages",
    },
)
DB_MESSAGE = _keys("dbMessage", "a stored message", "id role createdAt threadId resourceId type content")
DB_CONTENT = _keys(
    "dbContent",
    "a stored message's content",
    "format parts content metadata",
    {
        "toolInvocations": "v4's copy of the tool-invocation parts (kept with the stored message)",
        "reasoning": "v4's copy of the reasoning parts (kept with the stored message)",
        "annotations": "kept with the stored message; the model does not see them",
        "providerMetadata": "kept with the stored message; the model does not see it",
    },
    {"experimental_attachments": "kept with the stored message; the model sees its file parts, not these"},
)

TEXT = _keys("textPart", "a text part", "type text", None, _MODEL_COUNTED)
UI_TEXT = _keys(
    "uiTextPart",
    "a UI text part",
    "type text",
    {"state": "v5's streaming state of the part"},
    {"providerMetadata": _PROVIDER_METADATA},
)
IMAGE = _keys(
    "imagePart", "an image part", "type image url data mediaType mimeType filename", None, _MODEL_COUNTED
)
FILE = _keys(
    "filePart",
    "a file part",
    "type data url mediaType mimeType filename",
    None,
    {"providerMetadata": _PROVIDER_METADATA, **_MODEL_COUNTED},
)
ATTACHMENT = _keys("attachment", "an attachment", "url contentType name")
TOOL_CALL = _keys(
    "toolCallPart",
    "a tool-call part",
    "type toolCallId toolName input args providerExecuted",
    None,
    _MODEL_COUNTED,
)
TOOL_RESULT = _keys(
    "toolResultPart",
    "a tool-result part",
    "type toolCallId toolName result output providerOptions",
    {"input": "@mastra/client-js's copy of the call's input, which the call holds"},
    {
        "experimental_providerMetadata": _PROVIDER_OPTIONS,
        "isError": _IS_ERROR,
        "experimental_content": "the model sees the result, not v4's multi-part content",
        "__mastraObservability": _CLIENT_SPANS,
    },
)
TOOL_RESULT_OPTIONS = _keys(
    "toolResultPart",
    "a tool-result part",
    "providerOptions",
    None,
    {
        "providerOptions": "only its mastra.modelOutput (a client tool's toModelOutput) is read: "
        + _PROVIDER_OPTIONS
    },
)
"""A tool-result's ``providerOptions`` holding more than ``mastra.modelOutput`` (`messages._tool_result`)."""
UI_TOOL = _keys(
    "uiToolPart", "a tool-invocation part", "type toolInvocation providerMetadata providerExecuted"
)
UI_INVOCATION = _keys(
    "uiToolInvocation",
    "a toolInvocation",
    "state toolCallId toolName args result providerExecuted providerMetadata",
    {
        "step": "v4's step number: procmesh numbers the run's own steps",
        "requestContext": "the run's request context on a client tool's call: the call's own applies",
        "dynamic": "the reference's mark of a dynamic tool (procmesh has none)",
        "output": "the reference's copy of a provider-executed tool's output: the result is read",
    },
    {
        "observability": _CLIENT_SPANS,
        "isError": _IS_ERROR,
    },
)
UI_V5_TOOL = _keys(
    "uiV5ToolPart",
    "a v5 UI tool part",
    "type toolCallId toolName state input output errorText rawInput approval providerExecuted "
    "callProviderMetadata",
    {
        "title": "the UI's title of the tool",
        "dynamic": "v5's mark of a static tool part normalized to a dynamic one",
        "preliminary": "v5's mark of a tool's streamed output: the reference takes the output as the result",
    },
)
"""An AI SDK v5 / v6 UI tool part (``tool-<name>``, ``dynamic-tool``), read as @mastra/core 1.71's
``AIV5Adapter.fromUIMessage`` reads it (`messages._ui_tool_v5`)."""

_STORED_PART = "providerMetadata createdAt"
DB_PARTS = {
    "text": _keys("dbTextPart", "a stored text part", f"type text {_STORED_PART}"),
    "reasoning": _keys(
        "dbReasoningPart",
        "a stored reasoning part",
        f"type text reasoning details provider signature {_STORED_PART}",
    ),
    "tool-invocation": _keys(
        "dbToolPart",
        "a stored tool-invocation part",
        f"type toolInvocation provider providerExecuted title preliminary {_STORED_PART}",
    ),
    "file": _keys(
        "dbFilePart", "a stored file part", f"type data url mediaType mimeType filename {_STORED_PART}"
    ),
    "image": _keys(
        "dbImagePart", "a stored image part", f"type data url mediaType mimeType filename {_STORED_PART}"
    ),
    "step-start": _keys("dbStepStart", "a stored step-start part", f"type model {_STORED_PART}"),
    "data-": _keys("dbDataPart", "a stored data part", f"type id data {_STORED_PART}"),
}
DB_INVOCATION = _keys(
    "dbToolInvocation",
    "a stored toolInvocation",
    "state step toolCallId toolName args result isError errorText rawInput approval provider "
    "providerExecuted providerMetadata",
)

_PLAIN_KEY = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$-]{0,63}$")


def check(obj: dict[str, Any], where: str, keys: Keys, ignored: list[tuple[Keys, str]] | None) -> None:
    """A 400 naming the first key of `obj` that `keys` does not take (``messages.0.content.1.foo:
    unknown key``, with what the shape takes); its counted keys go to `ignored`."""
    unknown = sorted(k for k in obj if k not in keys.read and k not in keys.kept and k not in keys.counted)
    if unknown:
        key = unknown[0]
        at = f"{where}.{key}" if _PLAIN_KEY.match(key) else f"{where}.{label(key)}"
        taken = ", ".join(sorted(keys.read))
        accepted = ", ".join(sorted({*keys.kept, *keys.counted}))
        more = f"; accepted, not applied: {accepted}" if accepted else ""
        also = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise BadRequestError(f"{at}: unknown key{also} ({keys.what} takes {taken}{more})")
    if ignored is not None:
        ignored.extend((keys, k) for k in obj if k in keys.counted)


def db_part_keys(kind: Any) -> Keys | None:
    """A stored part's keys by its type (None for a type the contract's conversion judges)."""
    if isinstance(kind, str) and kind.startswith("data-"):
        return DB_PARTS["data-"]
    return DB_PARTS.get(kind) if isinstance(kind, str) else None


def ignored_labels(ignored: list[tuple[Keys, str]]) -> list[tuple[str, str]]:
    """Each ignored key once, as its metric label (``textPart.providerOptions``) and reason."""
    seen: dict[str, str] = {}
    for keys, key in ignored:
        seen.setdefault(f"{keys.label}.{key}", keys.reason(key))
    return sorted(seen.items())


def count_ignored(metrics: ServiceMetrics, whose: str, ignored: list[tuple[str, str]]) -> None:
    """Log and count the keys a request's input messages held that procmesh does not apply (each
    once a request: `ignored_labels`)."""
    if ignored:
        log.warning("%s input messages held keys not applied: %s", whose, ", ".join(n for n, _ in ignored))
    for name, _ in ignored:
        metrics.message_keys_ignored.labels(name).inc()
