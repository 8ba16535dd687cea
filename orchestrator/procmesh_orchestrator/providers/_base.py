"""What every HTTP provider shares: the connection (client, key, retries) and prompt-part helpers."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import httpx

from procmesh_orchestrator.config import ProviderConfig
from procmesh_orchestrator.errors import APICallError
from procmesh_orchestrator.providers._assets import DownloadPolicy, fetch_assets, make_download_client
from procmesh_orchestrator.providers._http import RetryPolicy, make_client, with_retries
from procmesh_orchestrator.run.models import Chunk, ModelRequest

_DATA_URL = re.compile(r"^data:(?P<type>[^;,]*)(?P<b64>;base64)?,(?P<data>.*)$", re.DOTALL)


class ProviderConnection:
    """One configured provider: its settings, its lazily created `httpx.AsyncClient`, its key.

    Every model of the provider shares the connection (and so the pooled
    connections); `aclose()` closes the client.
    """

    def __init__(
        self, name: str, config: ProviderConfig, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.name = name
        self.config = config
        self.retry = RetryPolicy(max_retries=config.max_retries, backoff_ms=config.retry_backoff_ms)
        self.downloads = DownloadPolicy.of(
            config.download_max_bytes, config.download_timeout, config.download_allow_hosts
        )
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._download_client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        """The shared client (created on first use, inside the running loop)."""
        if self._client is None:
            self._client = make_client(self.config.timeout, transport=self._transport)
        return self._client

    @property
    def download_client(self) -> httpx.AsyncClient:
        """The attachments' client (created on first use; never the API's: no proxies, no pool
        shared with the provider)."""
        if self._download_client is None:
            self._download_client = make_download_client()
        return self._download_client

    def api_key(self, model_id: str) -> str | None:
        """The key from the environment (read per call); None when the provider needs none.

        A configured `apiKeyEnv` that is unset or empty is a non-retryable
        `APICallError` naming the variable, raised when the model is first used.
        """
        env = self.config.api_key_env
        if env is None:
            return None
        key = os.environ.get(env, "")
        if not key:
            raise APICallError(
                f"providers.{self.name}.apiKeyEnv: environment variable {env} is not set "
                f"(needed by model {model_id!r})",
                status=0,
                retryable=False,
                error_id="API_KEY_MISSING",
            )
        return key

    async def aclose(self) -> None:
        """Close the client, if one was created."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._download_client is not None:
            await self._download_client.aclose()
            self._download_client = None


class HTTPModel:
    """Base of the HTTP models: `stream()` wraps one attempt in the provider's retry policy."""

    settings: ClassVar[dict[str, str]] = {}
    """The reference's model settings the API takes, by their wire names (the model's body)."""

    def __init__(self, connection: ProviderConnection, model: str) -> None:
        self.connection = connection
        self.model = model
        self.model_id = f"{connection.name}/{model}"
        self.specification_version = connection.config.specification_version

    def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        """Stream the response to `request` (see `orchestrator.models.ModelProvider`)."""
        return self._stream(request)

    async def _stream(self, request: ModelRequest) -> AsyncGenerator[Chunk, None]:
        # Attachments first, once: a provider-level retry does not download them again.
        conn = self.connection
        request = await fetch_assets(request, self.model_fetches, conn.download_client, conn.downloads)
        retry = conn.retry
        if request.model_settings.get("maxRetries") is not None:  # the call's modelSettings.maxRetries
            retry = replace(retry, max_retries=int(request.model_settings["maxRetries"]))
        async with contextlib.aclosing(
            with_retries(lambda: self._attempt(request), retry, what=self.model_id)
        ) as chunks:
            async for chunk in chunks:
                yield chunk

    def unsupported_settings(self, model_settings: dict[str, Any]) -> list[str]:
        """The reference's call settings given (not None) that this API has no field for: the
        body leaves them out, and the step's warnings name them (`run.models.setting_warnings`)."""
        return [
            key for key in CALL_SETTINGS if model_settings.get(key) is not None and key not in self.settings
        ]

    def model_fetches(self, media_type: str) -> bool:
        """Whether the model fetches a URL of `media_type` itself (else the provider downloads it)."""
        return False

    def _attempt(self, request: ModelRequest) -> AsyncGenerator[Chunk, None]:
        raise NotImplementedError


@dataclass(frozen=True)
class FileData:
    """A file part's data in the forms the wire formats take."""

    media_type: str
    url: str | None = None
    """An http(s) URL the provider fetches itself."""
    base64: str = ""
    """The bytes, base64-encoded (empty when `url` is set)."""

    @property
    def data_url(self) -> str:
        """The URL, or a ``data:`` URL holding the bytes."""
        return self.url or f"data:{self.media_type};base64,{self.base64}"

    def text(self) -> str:
        """The bytes decoded as UTF-8 (for text/* documents)."""
        return base64.b64decode(self.base64).decode("utf-8", errors="replace")


def file_data(part: dict[str, Any]) -> FileData:
    """A prompt file part's data: bytes, a ``data:`` URL, an http(s) URL or base64 text."""
    media_type = str(part.get("mediaType") or "application/octet-stream")
    data = part.get("data", "")
    if isinstance(data, bytes | bytearray):
        return FileData(media_type, base64=base64.b64encode(bytes(data)).decode("ascii"))
    text = str(data)
    if text.startswith(("http://", "https://")):
        return FileData(media_type, url=text)
    match = _DATA_URL.match(text)
    if match:
        payload = match["data"]
        if not match["b64"]:
            payload = base64.b64encode(payload.encode("utf-8")).decode("ascii")
        return FileData(match["type"] or media_type, base64=payload)
    return FileData(media_type, base64=text)


def provider_executed(prompt: list[dict[str, Any]]) -> set[str]:
    """The ids of the tool calls a provider executed itself (a web search on its side): they are
    not sent back, since neither wire format here can replay a server tool's result."""
    return {
        str(p.get("toolCallId"))
        for msg in prompt
        if isinstance(msg.get("content"), list)
        for p in msg["content"]
        if p.get("type") == "tool-call" and p.get("providerExecuted")
    }


def url_source(url: str, title: Any) -> Chunk:
    """A web page a model cited, as the reference's ``source`` chunk (its url is its id)."""
    return {"type": "source", "payload": {"id": url, "sourceType": "url", "url": url, "title": title}}


def tool_output_text(output: Any) -> str:
    """A tool result as the model reads it: strings as they are, anything else as JSON; a tool's
    model output in the AI SDK's shapes (toModelOutput) as its text, JSON or text parts."""
    kind = output.get("type") if isinstance(output, dict) and "value" in output else None
    if kind in ("text", "error-text") and isinstance(output["value"], str):
        return str(output["value"])
    if kind in ("json", "error-json"):
        return json.dumps(output["value"], ensure_ascii=False)
    if kind == "content" and isinstance(output["value"], list):
        parts = [p for p in output["value"] if isinstance(p, dict) and p.get("type") == "text"]
        texts = [p.get("text", "") for p in parts]
        return "\n".join(str(t) for t in texts)
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)


def tool_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool's JSON schema; an empty one becomes an object without properties."""
    schema = tool.get("inputSchema") or {}
    return schema if schema else {"type": "object", "properties": {}}


def usage(input_tokens: Any, output_tokens: Any) -> dict[str, int]:
    """The finish chunk's usage from provider counts (missing counts are 0)."""
    inp, out = int(input_tokens or 0), int(output_tokens or 0)
    return {"inputTokens": inp, "outputTokens": out, "totalTokens": inp + out}


def parse_tool_args(text: str, tool_name: str, model_id: str) -> Any:
    """Tool-call arguments the model streamed as JSON text (empty means no arguments)."""
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except ValueError:
        raise APICallError(
            f"{model_id} sent invalid JSON arguments for tool {tool_name!r}: {text[:200]!r}",
            status=0,
            retryable=False,
            error_id="INVALID_TOOL_ARGUMENTS",
        ) from None


def stream_cut(model_id: str, expected: str) -> APICallError:
    """The stream ended before its final event: the connection was closed early (transient)."""
    return APICallError(
        f"{model_id}: connection closed before the stream finished (no {expected})",
        status=0,
        retryable=True,
        error_id="STREAM_INCOMPLETE",
    )


# Mastra modelSettings -> body keys shared by both wire formats.
COMMON_SETTINGS = {"temperature": "temperature", "topP": "top_p"}
CALL_SETTINGS = (
    "temperature",
    "maxOutputTokens",
    "topP",
    "topK",
    "presencePenalty",
    "frequencyPenalty",
    "stopSequences",
    "seed",
)
"""The reference's call settings a model API may take (AI SDK ``CallSettings`` sent to the model;
``maxRetries`` is the provider's own retry count, never sent)."""
