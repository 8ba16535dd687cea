"""response-cache's key derivation, write rules and the in-memory backend."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

from procmesh_sidecars.builtins.response_cache import (
    ResponseCache,
    ResponseCacheOptions,
    build_key,
    clean_step,
    model_identity,
)
from procmesh_sidecars.cache import InMemoryServerCache
from tests.unit.sidecars.helpers import user

MODEL = model_identity("openai/gpt-4o")
PNG = b"\x89PNG fake bytes"


def key(prompt: list[dict[str, Any]], **kw: Any) -> str:
    args: dict[str, Any] = {
        "agent_id": "agent",
        "step_number": 0,
        "scope": None,
        "model": MODEL,
        "prompt": prompt,
    }
    args.update(kw)
    return build_key(**args)


def image(data: Any) -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "file", "mediaType": "image/png", "data": data},
            ],
        }
    ]


def test_key_is_deterministic_and_shaped() -> None:
    k = key([user("hi")])
    assert k == key([user("hi")])
    assert k.startswith("procmesh:agent-response:agent:")
    assert len(k.rsplit(":", 1)[1]) == 32


def test_every_input_changes_the_key() -> None:
    base = key([user("hi")])
    assert key([user("hello")]) != base
    assert key([user("hi")], step_number=1) != base
    assert key([user("hi")], agent_id="other") != base
    assert key([user("hi")], model=model_identity("openai/gpt-4.1")) != base
    scoped = key([user("hi")], scope="org-1")
    assert scoped != base
    assert scoped.split(":")[3] == hashlib.sha256(b"org-1").hexdigest()[:8]


def test_key_ignores_key_order_and_number_spelling() -> None:
    a = [
        {
            "role": "assistant",
            "content": [
                {"type": "tool-call", "toolCallId": "c", "toolName": "t", "input": {"a": 1, "b": 2.0}}
            ],
        }
    ]
    b = [
        {
            "content": [
                {"input": {"b": 2, "a": 1.0}, "toolName": "t", "toolCallId": "c", "type": "tool-call"}
            ],
            "role": "assistant",
        }
    ]
    assert key(a) == key(b)


def test_image_parts_contribute_their_url_or_a_digest_of_their_bytes() -> None:
    by_url = key(image("https://example.com/a.png"))
    assert by_url != key(image("https://example.com/b.png"))
    by_bytes = key(image(PNG))
    assert by_bytes != key(image(PNG + b"!"))
    # the same bytes inline or as a data: URL are the same image
    assert by_bytes == key(image("data:image/png;base64," + base64.b64encode(PNG).decode()))
    assert by_bytes != by_url


def test_model_identity() -> None:
    assert model_identity("anthropic/claude-x") == {
        "provider": "anthropic",
        "modelId": "claude-x",
        "specVersion": None,
    }
    assert model_identity("scripted") == {"provider": None, "modelId": "scripted", "specVersion": None}
    assert model_identity("openai/gpt-4o", "v3")["specVersion"] == "v3"
    # the spec version is in the key: a v2 and a v3 model of one id never share an entry
    v2, v3 = (key([user("hi")], model=model_identity("openai/gpt-4o", v)) for v in ("v2", "v3"))
    assert v2 != v3


@pytest.mark.parametrize(
    ("chunks", "ok"),
    [
        (
            [
                {"type": "text-delta", "payload": {"text": "x"}},
                {"type": "finish", "payload": {"finishReason": "stop"}},
            ],
            True,
        ),
        ([{"type": "finish", "payload": {"finishReason": "tool-calls"}}], True),
        ([{"type": "finish", "payload": {"finishReason": "length"}}], True),
        ([{"type": "finish", "payload": {"finishReason": "content-filter"}}], False),
        ([{"type": "error", "payload": {"message": "x"}}], False),
        ([{"type": "tripwire", "payload": {"reason": "x"}}], False),
    ],
)
def test_only_clean_steps_are_written(chunks: list[dict[str, Any]], ok: bool) -> None:
    assert clean_step(chunks) is ok


def test_scope_null_is_not_the_same_as_unset() -> None:
    assert ResponseCacheOptions().scope_given is False
    assert ResponseCacheOptions(scope=None).scope_given is True
    with pytest.raises(ValueError, match="needs a url"):
        ResponseCacheOptions(backend="redis")


CHUNKS = [
    {"type": "text-delta", "payload": {"text": "hello"}},
    {"type": "finish", "payload": {"finishReason": "stop"}},
]
ARGS = {"model": "m", "model_spec_version": "v2", "agent_id": "a", "resource_id": "", "request_context": {}}


def step(number: int, **record: Any) -> dict[str, Any]:
    return {"stepNumber": number, "toolResults": [], "tripwire": None, **record}


async def test_request_and_response_hooks() -> None:
    cache = ResponseCache()
    options = ResponseCacheOptions()
    state: dict[str, Any] = {}
    prompt = [user("hi")]
    assert (
        await cache.process_llm_request(prompt, options=options, state=state, step_number=0, **ARGS) is None
    )
    asked = await cache.process_llm_response(CHUNKS, from_cache=False, step_number=0, state=state)
    assert asked == {"output_result_if_clean": True}
    # held back in the run's state, not written: the run is not over yet
    other: dict[str, Any] = {}
    assert (
        await cache.process_llm_request(prompt, options=options, state=other, step_number=0, **ARGS) is None
    )
    await cache.process_output_result(
        {"finishReason": "stop", "steps": [step(0)]}, options=options, state=state
    )
    assert state == {}
    hit = await cache.process_llm_request(prompt, options=options, state=state, step_number=0, **ARGS)
    assert hit == {"response": CHUNKS, "tool_results": []}
    # a replayed response is not written again, and asks for nothing
    assert await cache.process_llm_response(CHUNKS, from_cache=True, step_number=0, state=state) is None


@pytest.mark.parametrize("finish", ["error", "other", "content-filter"])
async def test_a_run_that_did_not_end_cleanly_writes_nothing(finish: str) -> None:
    cache = ResponseCache()
    options = ResponseCacheOptions()
    state: dict[str, Any] = {}
    prompt = [user("hi")]
    await cache.process_llm_request(prompt, options=options, state=state, step_number=0, **ARGS)
    await cache.process_llm_response(CHUNKS, from_cache=False, step_number=0, state=state)
    await cache.process_output_result(
        {"finishReason": finish, "steps": [step(0)]}, options=options, state=state
    )
    assert await cache.process_llm_request(prompt, options=options, state={}, step_number=0, **ARGS) is None


async def test_a_retried_step_drops_the_attempt_it_replaces() -> None:
    cache = ResponseCache()
    options = ResponseCacheOptions()
    state: dict[str, Any] = {}
    rejected, retried = [user("hi")], [user("hi"), user("<system-reminder>be nicer</system-reminder>")]
    await cache.process_llm_request(rejected, options=options, state=state, step_number=0, **ARGS)
    await cache.process_llm_response(CHUNKS, from_cache=False, step_number=0, state=state)
    # processOutputStep asked for a retry: the same step again, with the feedback in its prompt
    await cache.process_llm_request(retried, options=options, state=state, step_number=0, **ARGS)
    await cache.process_llm_response(CHUNKS, from_cache=False, step_number=0, state=state)
    steps = [step(0, tripwire={"reason": "rude"}), step(0)]
    await cache.process_output_result({"finishReason": "stop", "steps": steps}, options=options, state=state)
    assert await cache.process_llm_request(rejected, options=options, state={}, step_number=0, **ARGS) is None
    assert await cache.process_llm_request(retried, options=options, state={}, step_number=0, **ARGS)


async def test_tool_results_are_stored_with_their_step_and_returned_on_a_hit() -> None:
    cache = ResponseCache()
    options = ResponseCacheOptions()
    state: dict[str, Any] = {}
    prompt = [user("look it up")]
    calls = [
        {"type": "tool-call", "payload": {"toolCallId": "c1", "toolName": "lookup", "args": {"q": "x"}}},
        {"type": "finish", "payload": {"finishReason": "tool-calls"}},
    ]
    recorded = [{"toolCallId": "c1", "toolName": "lookup", "args": {"q": "x"}, "result": {"v": 1}}]
    await cache.process_llm_request(prompt, options=options, state=state, step_number=0, **ARGS)
    await cache.process_llm_response(calls, from_cache=False, step_number=0, state=state)
    result = {"finishReason": "stop", "steps": [step(0, toolResults=recorded), step(1)]}
    await cache.process_output_result(result, options=options, state=state)
    hit = await cache.process_llm_request(prompt, options=options, state={}, step_number=0, **ARGS)
    assert hit == {"response": calls, "tool_results": recorded}


async def test_in_memory_ttl_and_size() -> None:
    now = [0.0]
    cache = InMemoryServerCache(max_size=2, clock=lambda: now[0])
    await cache.set("a", {"v": 1}, ttl_ms=1000)
    await cache.set("b", {"v": 2}, ttl_ms=0)  # no expiry
    assert await cache.get("a") == {"v": 1}
    now[0] = 1.5
    assert await cache.get("a") is None
    assert await cache.get("b") == {"v": 2}
    await cache.set("c", 3)
    await cache.set("d", 4)  # over max_size: the least recently used goes
    assert await cache.get("b") is None
    assert len(cache) == 2
