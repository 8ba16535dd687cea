"""Fake OpenAI-compatible and Anthropic APIs on real sockets (stdlib ThreadingHTTPServer, 127.0.0.1:0).

Each fake speaks its wire format (SSE when the body asks for ``stream``, JSON
otherwise), enforces the rules of the real API that the default error
processors recover from, and answers per model from a script:

- ``{"text": "a b c", "toolCalls": [{"id", "name", "args"}], "finish": <native reason>,
  "usage": [input, output]}``: an answer (every key optional);
- ``{"status": 429, "error": {"type", "message", "code"}, "headers": {...}}`` or
  ``{"status": 422, "raw": "..."}``: a rejection;
- ``"resetAfter": n``: send n events (or part of the JSON), then close the socket mid-body;
- ``"streamError": {"type", "message"}``: an SSE error event after the answer's first events;
- ``"holdAfter": n``: send n events, then nothing until the reader goes away (fake_wire.py).

The n-th request for a model gets the n-th reply (the last one repeats). Every
request is recorded, so tests count what each server received, and every streamed answer
(`streams`: bytes sent, cut or not).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tests.integration.providers.fake_wire import Event, Server, Stream

Reply = dict[str, Any]

ID_PATTERN = re.compile(r"^[a-zA-Z0-9_-]+$")
PATTERN_ERROR = f"String should match pattern '{ID_PATTERN.pattern}'"
PREFILL_MESSAGE = (
    "This model does not support assistant message prefill. The conversation must end with a user message."
)


@dataclass(frozen=True)
class Recorded:
    """One request the fake received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))


def error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> Reply:
    """A scripted rejection in the API's own error shape."""
    return {"status": status, "error": {"type": kind, "message": message, "code": code}}


class FakeAPI:
    """The shared machinery: server thread, scripts, request log. Subclasses speak a wire format."""

    path = ""
    prefix = ""

    def __init__(self, api_key: str | None = None) -> None:
        self.api_key = api_key
        self.text_only: set[str] = set()
        """Models that reject images and files."""
        self.requests: list[Recorded] = []
        self.streams: list[Stream] = []
        self.held = threading.Event()
        """Set once a ``holdAfter`` answer sent its events."""
        self.released = threading.Event()
        """Set once the reader of a held answer went away."""
        self._scripts: dict[str, list[Reply]] = {}
        self._lock = threading.Lock()
        self._server: Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> FakeAPI:
        server = Server(self)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    @property
    def base_url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{self.prefix}"

    # -- scripting and inspection ------------------------------------------------

    def script(self, model: str, *replies: Reply) -> None:
        with self._lock:
            self._scripts[model] = list(replies)

    def calls(self, model: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.model == model]

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.streams.clear()
            self.held.clear()
            self.released.clear()
            self._scripts.clear()
            self.text_only.clear()

    def respond(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply:
        with self._lock:
            n = sum(1 for r in self.requests if r.model == body.get("model"))
            self.requests.append(Recorded(path, headers, body))
            replies = self._scripts.get(str(body.get("model"))) or [{"text": "ok"}]
        rejected = self.check(headers, body)
        if rejected is not None:
            return rejected
        return replies[min(n, len(replies) - 1)]

    def stream_started(self) -> Stream:
        stream = Stream()
        with self._lock:
            self.streams.append(stream)
        return stream

    # -- the wire format (subclasses) -------------------------------------------

    def check(self, headers: dict[str, str], body: dict[str, Any]) -> Reply | None:
        raise NotImplementedError

    def error_body(self, err: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def events(self, reply: Reply, body: dict[str, Any]) -> Iterable[Event]:
        raise NotImplementedError

    def error_event(self, err: dict[str, Any]) -> Event:
        raise NotImplementedError

    def message(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


def _citations(sources: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Chat completions' ``url_citation`` annotations of these sources."""
    return [
        {"type": "url_citation", "url_citation": {**s, "start_index": 0, "end_index": 0}} for s in sources
    ]


def _locations(sources: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The Messages API's ``web_search_result_location`` citations of these sources."""
    return [
        {"type": "web_search_result_location", **s, "cited_text": "", "encrypted_index": ""} for s in sources
    ]


def _words(text: str) -> list[str]:
    return [w for w in re.split(r"(?= )", text) if w]


# -- OpenAI-compatible chat completions ---------------------------------------------------------


class FakeOpenAI(FakeAPI):
    """``POST /v1/chat/completions`` as OpenAI, vLLM or llama.cpp answer it."""

    path = "/v1/chat/completions"
    prefix = "/v1"

    def check(self, headers: dict[str, str], body: dict[str, Any]) -> Reply | None:
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            return error(401, "Incorrect API key provided.", code="invalid_api_key")
        seen_calls: set[str] = set()
        for msg in body.get("messages") or []:
            content = msg.get("content")
            media = isinstance(content, list) and any(p.get("type") != "text" for p in content)
            if media and body.get("model") in self.text_only:
                return error(400, "Invalid content: this model does not support image input.")
            for call in msg.get("tool_calls") or []:
                seen_calls.add(call["id"])
            if msg.get("role") == "tool" and msg.get("tool_call_id") not in seen_calls:
                return error(
                    400,
                    "Invalid parameter: messages with role 'tool' must be a response to a preceding "
                    "message with 'tool_calls'.",
                )
        return None

    def error_body(self, err: dict[str, Any]) -> dict[str, Any]:
        return {
            "error": {"message": err["message"], "type": err["type"], "param": None, "code": err.get("code")}
        }

    def _completion_chunk(
        self, body: dict[str, Any], choices: list[dict[str, Any]], **extra: Any
    ) -> dict[str, Any]:
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": body.get("model"),
            "choices": choices,
            **extra,
        }

    def _usage(self, reply: Reply) -> dict[str, int]:
        inp, out = reply.get("usage") or (11, 7)
        return {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out}

    def _finish(self, reply: Reply) -> str:
        return str(reply.get("finish") or ("tool_calls" if reply.get("toolCalls") else "stop"))

    def events(self, reply: Reply, body: dict[str, Any]) -> list[Event]:
        def delta(d: dict[str, Any], finish: str | None = None) -> Event:
            return None, self._completion_chunk(body, [{"index": 0, "delta": d, "finish_reason": finish}])

        events = [delta({"role": "assistant", "content": ""})]
        events += [delta({"reasoning_content": w}) for w in _words(reply.get("reasoning", ""))]
        events += [delta({"content": w}) for w in _words(reply.get("text", ""))]
        for k, call in enumerate(reply.get("toolCalls") or []):
            args = json.dumps(call.get("args", {}))
            half = len(args) // 2
            first = {"index": k, "id": call["id"], "type": "function", "function": {"name": call["name"]}}
            first["function"]["arguments"] = args[:half]
            events.append(delta({"tool_calls": [first]}))
            events.append(delta({"tool_calls": [{"index": k, "function": {"arguments": args[half:]}}]}))
        if reply.get("sources"):  # [{url, title}]: a web-search model's citations, at the end
            events.append(delta({"annotations": _citations(reply["sources"])}))
        events.append(delta({}, self._finish(reply)))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append((None, self._completion_chunk(body, [], usage=self._usage(reply))))
        events.append((None, "[DONE]"))
        return events

    def error_event(self, err: dict[str, Any]) -> Event:
        return None, {"error": {"message": err["message"], "type": err["type"], "code": err.get("code")}}

    def message(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        calls = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["args"])},
            }
            for c in reply.get("toolCalls") or []
        ]
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("text") or None}
        if calls:
            message["tool_calls"] = calls
        if reply.get("sources"):
            message["annotations"] = _citations(reply["sources"])
        if reply.get("reasoning"):  # an OpenAI-compatible API's (DeepSeek's) reasoning_content
            message["reasoning_content"] = reply["reasoning"]
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish(reply)}],
            "usage": self._usage(reply),
        }


# -- Anthropic Messages -----------------------------------------------------------------------


class FakeAnthropic(FakeAPI):
    """``POST /v1/messages`` with the real API's validation of roles, tool ids and prefill."""

    path = "/v1/messages"

    def check(self, headers: dict[str, str], body: dict[str, Any]) -> Reply | None:
        if self.api_key is not None and headers.get("x-api-key") != self.api_key:
            return error(401, "invalid x-api-key", "authentication_error")
        if headers.get("anthropic-version") != "2023-06-01":
            return error(400, "anthropic-version: header is required")
        if not isinstance(body.get("max_tokens"), int):
            return error(400, "max_tokens: Field required")
        messages = body.get("messages") or []
        if not messages:
            return error(400, "messages: at least one message is required")
        previous_tool_uses: set[str] = set()
        for i, msg in enumerate(messages):
            if msg["role"] != ("user" if i % 2 == 0 else "assistant"):
                return error(400, 'messages: roles must alternate between "user" and "assistant"')
            tool_uses: set[str] = set()
            for j, block in enumerate(msg["content"]):
                kind = block.get("type")
                if kind == "tool_use" and not ID_PATTERN.match(block["id"]):
                    return error(
                        400,
                        f"messages.{i}.content.{j}.tool_use.id: {PATTERN_ERROR}",
                    )
                if kind == "tool_use":
                    tool_uses.add(block["id"])
                if kind == "tool_result":
                    ref = block["tool_use_id"]
                    if not ID_PATTERN.match(ref):
                        return error(
                            400,
                            f"messages.{i}.content.{j}.tool_result.tool_use_id: {PATTERN_ERROR}",
                        )
                    if ref not in previous_tool_uses:
                        return error(
                            400,
                            f"messages.{i}.content.{j}: unexpected `tool_use_id` in `tool_result`: {ref}",
                        )
                if kind in ("image", "document") and body.get("model") in self.text_only:
                    return error(400, f"messages.{i}.content.{j}: this model does not support images")
            previous_tool_uses = tool_uses
        if messages[-1]["role"] == "assistant":
            return error(400, PREFILL_MESSAGE)
        return None

    def error_body(self, err: dict[str, Any]) -> dict[str, Any]:
        return {"type": "error", "error": {"type": err["type"], "message": err["message"]}}

    def _stop(self, reply: Reply) -> str:
        return str(reply.get("finish") or ("tool_use" if reply.get("toolCalls") else "end_turn"))

    def events(self, reply: Reply, body: dict[str, Any]) -> list[Event]:
        inp, out = reply.get("usage") or (11, 7)
        events: list[Event] = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_1",
                        "type": "message",
                        "role": "assistant",
                        "model": body.get("model"),
                        "content": [],
                        "stop_reason": None,
                        "usage": {"input_tokens": inp, "output_tokens": 1},
                    },
                },
            ),
            ("ping", {"type": "ping"}),
        ]
        index = 0
        if reply.get("thinking"):  # {"text", "signature"}: a thinking block first, signed
            thinking = reply["thinking"]
            block = {"type": "thinking", "thinking": "", "signature": ""}
            events.append(
                ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block})
            )
            deltas = [{"type": "thinking_delta", "thinking": w} for w in _words(thinking["text"])]
            deltas.append({"type": "signature_delta", "signature": thinking["signature"]})
            for delta in deltas:
                events.append(
                    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
                )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
            index = 1
        if reply.get("text"):
            events.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            )
            for w in _words(reply["text"]):
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "text_delta", "text": w},
                        },
                    )
                )
            for cited in _locations(reply.get("sources") or []):  # [{url, title}], after the text
                delta = {"type": "citations_delta", "citation": cited}
                events.append(
                    ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
                )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
            index += 1
        for call in reply.get("toolCalls") or []:
            start = {"type": "tool_use", "id": call["id"], "name": call["name"], "input": {}}
            events.append(
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": start},
                )
            )
            args = json.dumps(call.get("args", {}))
            for piece in ("", args[: len(args) // 2], args[len(args) // 2 :]):
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append(
                    ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
                )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
            index += 1
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self._stop(reply), "stop_sequence": None},
                    "usage": {"output_tokens": out},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    def error_event(self, err: dict[str, Any]) -> Event:
        return "error", {"type": "error", "error": {"type": err["type"], "message": err["message"]}}

    def message(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        inp, out = reply.get("usage") or (11, 7)
        content: list[dict[str, Any]] = []
        if reply.get("thinking"):
            thinking = reply["thinking"]
            content.append(
                {"type": "thinking", "thinking": thinking["text"], "signature": thinking["signature"]}
            )
        if reply.get("text"):
            content.append(
                {"type": "text", "text": reply["text"], "citations": _locations(reply.get("sources") or [])}
            )
        for call in reply.get("toolCalls") or []:
            content.append(
                {"type": "tool_use", "id": call["id"], "name": call["name"], "input": call.get("args", {})}
            )
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": content,
            "stop_reason": self._stop(reply),
            "stop_sequence": None,
            "usage": {"input_tokens": inp, "output_tokens": out},
        }
