"""`response-cache`: replays a cached model response for an identical request (per step).

``processLLMRequest`` derives a deterministic key from the agent id, the step
number, the scope, the model identity and the resolved provider prompt (after
memory and the earlier input processors), looks it up and, on a hit, returns the
cached chunks and the recorded results of their tool calls: the loop replays
them instead of calling the model, and replays the tool results instead of
running the tools again.

Writes follow the seeds: a failed run (an error, a tripwire) is never cached.
On a miss the key is stashed in the run's state; ``processLLMResponse`` holds
the step's chunks back in the state when the step's own chunks are clean (no
``error`` / ``tripwire`` chunk, finish reason ``stop``, ``length`` or
``tool-calls``; never a response that came from the cache) and asks for
``processOutputResult`` at the run's clean end. The orchestrator calls it only
when nothing failed and every output processor accepted the run, whichever lane
this processor is in; only then are the held steps written, each with its tool
results as the run recorded them. A step that ``processOutputStep`` rejected
(retried or not) is never among them.

Scope (tenant isolation): the explicit ``scope`` option; else the request's
resource id (the ``resource_id`` argument, or ``mastra__resourceId`` in the
request context); ``scope: null`` shares entries between all callers. Per call,
``request_context["responseCache"]`` (or the reference's
``mastra__response_cache_context``) may set ``key``, ``scope`` and ``bust``
(skip the read, still write).

Backends: ``memory`` (default; per sidecar process, bounded) or ``redis``
(``url``; redis-py's asyncio client, shared by every sidecar using that server).

The seeds' code-level forms, for your own sidecar and the in-process Python API: a sidecar may
serve ``ResponseCache(cache=..., key=...)`` with its own backend (any `ServerCache`) and a key
function (``KeyInputs`` -> key; a raise falls back to the derived key), and
`ResponseCache.context` / `ResponseCache.apply_context` build a call's request context.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypedDict

from pydantic import BaseModel, Field, model_validator

from procmesh import Processor
from procmesh.errors import InvalidInputError
from procmesh_sidecars.builtins._common import Chunk, PromptMessage, js_stringify
from procmesh_sidecars.cache import InMemoryServerCache, RedisServerCache, ServerCache

log = logging.getLogger(__name__)

DEFAULT_TTL_SECONDS = 300
KEY_PREFIX = "procmesh:agent-response:"
CONTEXT_KEYS = ("responseCache", "mastra__response_cache_context")
RESOURCE_ID_KEY = "mastra__resourceId"
_CLEAN_FINISH = ("stop", "length", "tool-calls")
_PENDING_KEY = "pendingKey"
_PENDING_TTL = "pendingTtl"
_HELD = "held"
"""State: the steps of this run waiting for its clean end, by step number: key, ttl, chunks."""


class ResponseCacheOptions(BaseModel):
    """Options of `response-cache` (``cache`` of the reference is `backend` + `url` here)."""

    backend: Literal["memory", "redis"] = "memory"
    url: str | None = None
    """Redis URL (``redis://host:port/db``); required for the redis backend."""
    key: str | None = None
    """A fixed key instead of the derived one (usually set per call)."""
    ttl: float = Field(default=DEFAULT_TTL_SECONDS, ge=0)
    """Seconds an entry lives (0: no expiry)."""
    scope: str | None = None
    """Tenant scope; leave unset to use the request's resource id, null to share across callers."""
    bust: bool = False
    """Skip the cache read (still write): a forced refresh."""
    agent_id: str | None = None
    """The key's namespace; default: the running agent's id."""
    max_size: int = Field(default=1000, ge=1)
    """memory backend: entries kept (least recently used go first)."""

    @model_validator(mode="after")
    def _url(self) -> ResponseCacheOptions:
        if self.backend == "redis" and not self.url:
            raise ValueError("backend 'redis' needs a url, e.g. redis://127.0.0.1:6379/0")
        return self

    @property
    def scope_given(self) -> bool:
        """Whether `scope` was set (to a string or to null) rather than left out."""
        return "scope" in self.model_fields_set


def model_identity(model: str, spec_version: str = "") -> dict[str, str | None]:
    """Provider and model id from the step's model reference (``provider/model-id`` or a config
    name), and the specification version the model reports (``unknown`` in the key when empty)."""
    provider, sep, model_id = model.partition("/")
    if not sep:
        return {"provider": None, "modelId": model or None, "specVersion": spec_version or None}
    return {"provider": provider or None, "modelId": model_id or None, "specVersion": spec_version or None}


def _binary(data: bytes) -> str:
    return f"binary:{len(data)}:{hashlib.sha256(data).hexdigest()}"


def normalize_prompt(value: Any) -> Any:
    """The prompt as hashed: file data as a digest of its bytes (inline or a ``data:`` URL) or
    ``url:<href>``; ``providerOptions.mastra`` and null values dropped."""
    if isinstance(value, list):
        return [normalize_prompt(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return _binary(bytes(value))
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for k, v in value.items():
        if v is None:
            continue
        if k == "providerOptions" and isinstance(v, dict):
            kept = {pk: normalize_prompt(pv) for pk, pv in v.items() if pk != "mastra"}
            if kept:
                out[k] = kept
            continue
        if k in ("data", "url") and value.get("type") in ("file", "image") and isinstance(v, str):
            out[k] = _file_data(v)
            continue
        out[k] = normalize_prompt(v)
    return out


def _file_data(data: str) -> str:
    if data.startswith("data:"):
        header, _, payload = data.partition(",")
        try:
            raw = (
                base64.b64decode(payload, validate=False) if header.endswith(";base64") else payload.encode()
            )
        except (binascii.Error, ValueError):
            raw = data.encode()
        return _binary(raw)
    if "://" in data or data.startswith(("http:", "https:")):
        return f"url:{data}"
    try:  # inline base64 without a data: header
        return _binary(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return data


class KeyInputs(TypedDict):
    """What the derived key hashes, as a key function receives it (``build_key(**inputs)``
    derives the default key; the seeds' ``buildResponseCacheKey({...inputs, scope})``)."""

    agent_id: str
    step_number: int
    scope: str | None
    model: dict[str, str | None]
    prompt: list[PromptMessage]


KeyFunction = Callable[[KeyInputs], "str | Awaitable[str]"]
"""A sidecar's own key derivation (the seeds' ``key`` function)."""
_UNSET: Any = object()
_BACKEND_OPTIONS = ("backend", "url", "max_size")


def build_key(
    *,
    agent_id: str,
    step_number: int,
    scope: str | None,
    model: dict[str, str | None],
    prompt: list[PromptMessage],
) -> str:
    """The deterministic key: ``procmesh:agent-response:<agent>[:<scope digest>]:<digest>``."""
    model_tag = ":".join(model.get(k) or "unknown" for k in ("provider", "modelId", "specVersion"))
    payload = {
        "agent": agent_id,
        "step": step_number,
        "scope": scope or "",
        "model": model_tag,
        "prompt": normalize_prompt(prompt),
    }
    digest = hashlib.sha256(js_stringify(payload, sort_keys=True).encode()).hexdigest()[:32]
    scope_tag = f":{hashlib.sha256(scope.encode()).hexdigest()[:8]}" if scope else ""
    return f"{KEY_PREFIX}{agent_id}{scope_tag}:{digest}"


def clean_step(chunks: list[Chunk]) -> bool:
    """Whether a step's chunks may be cached: no error or tripwire, a successful finish."""
    for chunk in chunks:
        kind = chunk.get("type")
        if kind in ("error", "tripwire"):
            return False
        if kind == "finish":
            reason = (chunk.get("payload") or {}).get("finishReason")
            if reason and reason not in _CLEAN_FINISH:
                return False
    return True


class ResponseCache(Processor):
    """Per-step LLM response cache: lookup before the provider call, write at a clean run's end."""

    id = "response-cache"
    name = "Response Cache"
    description = "Replays cached model responses for identical requests (memory or Redis backend)."
    Options = ResponseCacheOptions

    def __init__(self, *, cache: ServerCache | None = None, key: KeyFunction | None = None) -> None:
        """`cache`: this instance's own backend (then the options cannot choose one); `key`: derives
        each call's key (a string or per-call `key` still wins; a raise falls back to the default)."""
        self._cache = cache
        self._key = key
        self._memory: dict[int, InMemoryServerCache] = {}
        self._redis: dict[str, RedisServerCache] = {}

    @staticmethod
    def context(*, key: str = _UNSET, scope: str | None = _UNSET, bust: bool = _UNSET) -> dict[str, Any]:
        """A new request context holding a call's overrides (the seeds' ``ResponseCache.context()``).

        ``agent.generate(text, CallOptions(request_context=ResponseCache.context(bust=True)))``.
        """
        return ResponseCache.apply_context({}, key=key, scope=scope, bust=bust)

    @staticmethod
    def apply_context(
        request_context: dict[str, Any],
        *,
        key: str = _UNSET,
        scope: str | None = _UNSET,
        bust: bool = _UNSET,
    ) -> dict[str, Any]:
        """Set a call's overrides in an existing request context (replacing earlier ones), in place;
        returns it (the seeds' ``ResponseCache.applyContext()``). Only the fields given are set."""
        given = {"key": key, "scope": scope, "bust": bust}
        request_context[CONTEXT_KEYS[0]] = {name: v for name, v in given.items() if v is not _UNSET}
        return request_context

    def cache_for(self, options: ResponseCacheOptions) -> ServerCache:
        """The backend: this instance's own, else the one the options select (one per process per
        max_size / per Redis URL)."""
        if self._cache is not None:
            chosen = sorted(set(_BACKEND_OPTIONS) & options.model_fields_set)
            if chosen:
                raise InvalidInputError(f"response-cache: this sidecar sets its own backend; remove {chosen}")
            return self._cache
        if options.backend == "redis":
            url = str(options.url)
            if url not in self._redis:
                self._redis[url] = RedisServerCache(url)
            return self._redis[url]
        if options.max_size not in self._memory:
            self._memory[options.max_size] = InMemoryServerCache(max_size=options.max_size)
        return self._memory[options.max_size]

    async def teardown(self) -> None:
        for cache in self._redis.values():
            await cache.aclose()

    async def process_llm_request(
        self,
        prompt: list[PromptMessage],
        model: str,
        model_spec_version: str,
        step_number: int,
        agent_id: str,
        resource_id: str,
        request_context: dict[str, Any],
        options: ResponseCacheOptions,
        state: dict[str, Any],
    ) -> dict[str, Any] | None:
        state.pop(_PENDING_KEY, None)
        state.pop(_PENDING_TTL, None)
        # this step is being tried again (a processor asked for a retry, or the provider failed):
        # what an earlier attempt held back was rejected
        held = state.get(_HELD)
        if isinstance(held, dict):
            held.pop(str(step_number), None)
        per_call = _per_call(request_context)
        bust = bool(per_call.get("bust", options.bust))
        if "scope" in per_call:
            scope = per_call["scope"]
        elif options.scope_given:
            scope = options.scope
        else:
            context_resource = request_context.get(RESOURCE_ID_KEY)
            if context_resource is not None and not isinstance(context_resource, str):
                # taken for no resource, the entry would be shared by every caller
                raise InvalidInputError(
                    f"response-cache: request_context[{RESOURCE_ID_KEY!r}] must be a string, "
                    f"not {type(context_resource).__name__}"
                )
            scope = resource_id or context_resource
        cache = self.cache_for(options)
        inputs = KeyInputs(
            agent_id=options.agent_id or agent_id,
            step_number=step_number,
            scope=scope if isinstance(scope, str) else None,
            model=model_identity(model, model_spec_version),
            prompt=prompt,
        )
        key = per_call.get("key", options.key)
        if not isinstance(key, str) or not key:
            key = await self._derive_key(inputs)
        if not bust:
            try:
                cached = await cache.get(key)
            except Exception:  # a read failure never fails the run: call the model, do not write
                log.warning("response-cache: read failed; calling the model", exc_info=True)
                return None
            if isinstance(cached, dict) and cached.get("chunks"):
                return {"response": cached["chunks"], "tool_results": cached.get("toolResults") or []}
        state[_PENDING_KEY] = key
        state[_PENDING_TTL] = options.ttl
        return None

    async def _derive_key(self, inputs: KeyInputs) -> str:
        if self._key is not None:
            try:
                derived = self._key(inputs)
                if inspect.isawaitable(derived):
                    derived = await derived
                if isinstance(derived, str) and derived:
                    return derived
                log.warning("response-cache: the key function returned %r; using the derived key", derived)
            except Exception:  # the seeds: a throwing key function falls back to the derived key
                log.warning("response-cache: the key function failed; using the derived key", exc_info=True)
        return build_key(**inputs)

    async def process_llm_response(
        self,
        chunks: list[Chunk],
        from_cache: bool,
        step_number: int,
        state: dict[str, Any],
    ) -> dict[str, bool] | None:
        key = state.pop(_PENDING_KEY, None)
        ttl = state.pop(_PENDING_TTL, None)
        if from_cache or not key or not chunks or not clean_step(chunks):
            return None
        # Held back, not written: a later processOutputStep or processOutputResult may still reject
        # the step or the run, and a failed run must leave no entry.
        held = state.setdefault(_HELD, {})
        held[str(step_number)] = {"key": key, "ttl": ttl, "chunks": chunks}
        return {"output_result_if_clean": True}

    async def process_output_result(
        self, result: dict[str, Any], options: ResponseCacheOptions, state: dict[str, Any]
    ) -> None:
        """The run ended cleanly: write the steps held back, with their tool results."""
        held = state.pop(_HELD, None)
        if not isinstance(held, dict) or result.get("finishReason") not in _CLEAN_FINISH:
            return
        # the accepted record of each step is its last one (a retried attempt's comes before it)
        records = {step.get("stepNumber"): step for step in result.get("steps") or []}
        cache = self.cache_for(options)
        for number, entry in held.items():
            record = records.get(int(number))
            if record is None or record.get("tripwire"):
                continue
            value: dict[str, Any] = {"chunks": entry["chunks"]}
            if record.get("toolResults"):
                value["toolResults"] = record["toolResults"]
            ttl = entry.get("ttl")
            try:
                await cache.set(str(entry["key"]), value, float(options.ttl if ttl is None else ttl) * 1000)
            except Exception:  # a write failure never fails the run
                log.warning("response-cache: write failed", exc_info=True)


_PER_CALL: dict[str, tuple[type, ...]] = {"key": (str,), "scope": (str, type(None)), "bust": (bool,)}
"""What a call may override (the seeds: key a string, scope a string or null, bust a boolean)."""


def _per_call(request_context: dict[str, Any]) -> dict[str, Any]:
    """The call's overrides, each of the seeds' type; InvalidInputError naming anything else, never
    ignored (a ``scope`` of another type once fell back to no scope: an entry shared by every
    caller; ``ttl``, ``agentId`` and the backend are the instance's, never a call's)."""
    for name in CONTEXT_KEYS:
        value = request_context.get(name)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise InvalidInputError(f"response-cache: request_context[{name!r}] must be an object")
        for field, given in value.items():
            if field not in _PER_CALL:
                raise InvalidInputError(
                    f"response-cache: request_context[{name!r}].{field} is not a per-call setting "
                    f"(the seeds' are {', '.join(_PER_CALL)}; ttl, agentId and the backend are the "
                    "lane entry's options)"
                )
            if not isinstance(given, _PER_CALL[field]):
                wanted = {"key": "a string", "scope": "a string or null", "bust": "true or false"}[field]
                raise InvalidInputError(
                    f"response-cache: request_context[{name!r}].{field} must be {wanted}, "
                    f"not {type(given).__name__}"
                )
        return value
    return {}
