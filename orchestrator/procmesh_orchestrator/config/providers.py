"""The models agents may call: built-in models (``models.NAME``) and HTTP providers
(``providers.NAME``, and the default ``openai`` and ``anthropic``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class _Scripted(BaseModel):
    """A scripted response's objects: their camelCase keys only (the model reads no other)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, frozen=True)


class _ScriptedToolCall(_Scripted):
    name: str = Field(min_length=1)
    args: dict[str, Any] = {}


class _ScriptedError(_Scripted):
    status: int = 400
    message: str = "API error"
    retryable: bool = False
    body: str = ""


class _ScriptedUsage(_Scripted):
    input_tokens: int = Field(default=10, ge=0)
    output_tokens: int = Field(default=5, ge=0)


class ScriptedResponse(_Scripted):
    """One ``scripted`` response, its keys checked (a misspelt ``toolCall`` would otherwise answer
    with text and no tool call); the model reads the dict as given (`ScriptedModel`)."""

    text: str = ""
    deltas: list[str] | None = None
    tool_calls: list[_ScriptedToolCall] = []
    error: _ScriptedError | None = None
    usage: _ScriptedUsage | None = None
    finish_reason: str | None = None


class ModelConfig(_Model):
    """A built-in model the agents may use: ``demo`` or ``scripted`` responses.

    HTTP models need no entry here: agents name them ``provider/model-id``.
    """

    provider: Literal["demo", "scripted"]
    responses: list[dict[str, Any]] = []
    """``scripted`` only: one response per model call (shapes: docs/configuration.md; each
    checked as a `ScriptedResponse`, an unknown key refused by its path)."""
    delay_ms: float = Field(default=0.0, ge=0)
    """Pause between streamed deltas (demo pacing, benchmarks)."""
    specification_version: Literal["v2", "v3"] = "v2"
    """The model specification version the model reports (the reference's ``specificationVersion``:
    ``v2`` for AI SDK 5 providers, ``v3`` for AI SDK 6): part of ``response-cache`` keys."""

    @field_validator("responses")
    @classmethod
    def _scripted(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, response in enumerate(value):
            try:
                ScriptedResponse.model_validate(response)
            except ValidationError as exc:
                where = (f"{i}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
                raise ValueError("; ".join(where)) from None
        return value

    @model_validator(mode="after")
    def _scripted_only(self) -> ModelConfig:
        if self.responses and self.provider != "scripted":  # the demo model answers on its own
            raise ValueError(
                f"responses: read by a scripted model only (this one's provider is {self.provider!r})"
            )
        return self


ProviderKind = Literal["openai", "anthropic"]

_DEFAULT_BASE_URLS: dict[str, str] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
}


class ProviderConfig(_Model):
    """An HTTP model provider; agents name its models as ``provider/model-id``.

    The API key is read from the environment variable `api_key_env` when a
    model is used, never from the file.
    """

    kind: ProviderKind
    """Wire format: ``openai`` (chat completions: OpenAI, vLLM, Ollama, llama.cpp) or ``anthropic``."""
    base_url: str = Field(default="", validate_default=True)
    """API root, e.g. ``http://127.0.0.1:8080/v1``; default: the kind's public endpoint."""
    api_key_env: str | None = None
    """Environment variable holding the key; unset for local servers that need none."""
    max_retries: int = Field(default=0, ge=0)
    """Provider-level retries of retryable failures before any chunk arrived (0: the error
    processors, e.g. ``stream-error-retry-processor``, decide)."""
    retry_backoff_ms: float = Field(default=500.0, ge=0)
    """First backoff; doubles per retry (a longer Retry-After wins)."""
    timeout: float = Field(default=60.0, gt=0)
    """Seconds for connecting and between received bytes."""
    max_tokens: int | None = Field(default=None, gt=0)
    """Output token limit sent with each request (anthropic requires one: default 4096)."""
    specification_version: Literal["v2", "v3"] = "v2"
    """The model specification version the model reports (the reference's ``specificationVersion``:
    ``v2`` for AI SDK 5 providers, ``v3`` for AI SDK 6): part of ``response-cache`` keys."""
    download_max_bytes: int = Field(default=20 * 1024 * 1024, gt=0)
    """Largest attachment the provider downloads for a model that cannot fetch its URL."""
    download_timeout: float = Field(default=30.0, gt=0)
    """Seconds one attachment download may take, redirects included."""
    download_allow_hosts: list[str] = []
    """Internal hosts attachments may be downloaded from: host names or networks (``10.2.0.0/16``,
    ``127.0.0.1``). Without them only public addresses are fetched (a caller's URL must not reach
    the pod's network)."""

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str, info: ValidationInfo) -> str:
        value = value or _DEFAULT_BASE_URLS.get(info.data.get("kind", ""), "")
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"baseUrl must start with http:// or https://, got {value!r}")
        return value.rstrip("/")


DEFAULT_PROVIDERS: dict[str, ProviderConfig] = {
    "openai": ProviderConfig(kind="openai", api_key_env="OPENAI_API_KEY"),
    "anthropic": ProviderConfig(kind="anthropic", api_key_env="ANTHROPIC_API_KEY"),
}
"""Providers usable without declaring them (a declared provider of the same name wins)."""
