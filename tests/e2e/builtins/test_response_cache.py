"""response-cache through a real `procmesh-sidecar response-cache` process, with the in-memory
backend and with a real redis-server of this module's on a unix socket (`redis_server`)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config.agents import AgentMemoryConfig
from procmesh_orchestrator.errors import APICallError, ProcessorFailedError
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.sidecar_process import SidecarProcess
from procmesh_orchestrator.store import StorageConfig
from procmesh_sidecars.builtins.response_cache import ResponseCache
from tests.e2e.builtins.harness import call, make_config, model_requests, ref, start
from tests.e2e.service.conftest import redis_server
from tests.e2e.service.durable_harness import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

__all__ = ["redis_server"]  # a fixture, imported for this module

RESPONSES = [{"text": "first answer"}, {"text": "second answer"}, {"text": "third answer"}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def address(start_sidecar: Callable[..., SidecarProcess]) -> str:
    return await start(start_sidecar, "response-cache")


def cfg(address: str, responses: list[dict] | None = None, **options: object) -> object:
    return make_config(
        address, input_processors=[ref("response-cache", **options)], responses=responses or RESPONSES
    )


def ctx(**values: object) -> CallOptions:
    return CallOptions(request_context=dict(values))


async def test_identical_call_is_served_from_cache(address: str) -> None:
    async with App(cfg(address, scope="t-identical")) as app:
        first = await call(app, "what is up?", stream=True)
        second = await call(app, "what is up?", stream=True)
        third = await call(app, "what is up?")
        assert first.result.text == second.result.text == third.result.text == "first answer"
        assert len(model_requests(app)) == 1  # the later calls never reached the model
        assert second.text_deltas() == first.text_deltas() == ["first", " answer"]  # replayed as streamed
        assert second.kinds()[-1] == "finish"


async def test_different_prompts_get_different_entries(address: str) -> None:
    async with App(cfg(address, scope="t-different")) as app:
        a = await call(app, "question A")
        b = await call(app, "question B")
        assert (a.result.text, b.result.text) == ("first answer", "second answer")
        assert len(model_requests(app)) == 2


async def test_failed_steps_are_never_written(address: str) -> None:
    responses = [
        {"error": {"status": 400, "message": "bad request"}},
        {"text": "filtered", "finishReason": "content-filter"},
        {"text": "good"},
        {"text": "unused"},
    ]
    async with App(cfg(address, responses, scope="t-failed")) as app:
        with pytest.raises(APICallError, match="bad request"):
            await call(app, "q")
        assert (await call(app, "q")).result.text == "filtered"  # not cached: odd finish reason
        assert (await call(app, "q")).result.text == "good"
        assert (await call(app, "q")).result.text == "good"  # now from the cache
        assert len(model_requests(app)) == 3


async def test_bust_skips_the_read_but_rewrites(address: str) -> None:
    async with App(cfg(address, scope="t-bust")) as app:
        assert (await call(app, "q")).result.text == "first answer"
        busted = await call(app, "q", options=CallOptions(request_context=ResponseCache.context(bust=True)))
        assert busted.result.text == "second answer"
        assert (await call(app, "q")).result.text == "second answer"  # the busted call rewrote the entry
        assert len(model_requests(app)) == 2


async def test_per_call_key_shares_an_entry_across_prompts(address: str) -> None:
    async with App(cfg(address, scope="t-key")) as app:
        # merged into a context that holds other values (the seeds' ResponseCache.applyContext)
        context = ResponseCache.apply_context({"caller-meta": {"userId": "u-123"}}, key="suggested-prompt-1")
        assert context == {"caller-meta": {"userId": "u-123"}, "responseCache": {"key": "suggested-prompt-1"}}
        options = CallOptions(request_context=context)
        assert (await call(app, "one wording", options=options)).result.text == "first answer"
        assert (await call(app, "another wording", options=options)).result.text == "first answer"
        assert len(model_requests(app)) == 1


async def test_scope_by_resource_id_explicit_scope_and_shared_null(address: str) -> None:
    async with App(cfg(address)) as app:  # default scope: the request's resource id
        alice = ctx(mastra__resourceId="alice")
        bob = ctx(mastra__resourceId="bob")
        assert (await call(app, "q", options=alice)).result.text == "first answer"
        assert (await call(app, "q", options=bob)).result.text == "second answer"  # isolated per user
        assert (await call(app, "q", options=alice)).result.text == "first answer"
        # a per-call scope overrides the resource id; null opts out of isolation
        shared_alice = ctx(**ResponseCache.apply_context({"mastra__resourceId": "alice"}, scope=None))
        shared_bob = ctx(**ResponseCache.apply_context({"mastra__resourceId": "bob"}, scope=None))
        assert (await call(app, "q", options=shared_alice)).result.text == "third answer"
        assert (await call(app, "q", options=shared_bob)).result.text == "third answer"
        assert len(model_requests(app)) == 3


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ({"scope": 7}, "request_context['responseCache'].scope must be a string or null, not int"),
        ({"key": ["k"]}, "request_context['responseCache'].key must be a string, not list"),
        ({"bust": "yes"}, "request_context['responseCache'].bust must be true or false, not str"),
        ({"ttl": 5}, "request_context['responseCache'].ttl is not a per-call setting"),
        ("bust", "request_context['responseCache'] must be an object"),  # once read as no setting
        (None, "request_context['mastra__resourceId'] must be a string, not int"),
    ],
)
async def test_a_per_call_setting_of_another_type_is_refused_naming_it(
    address: str, entry: dict[str, Any] | str | None, named: str
) -> None:
    """A per-call scope (or a resource id) that is not a string (nor null) once fell back to no
    scope: one caller's answer was served to another. The call fails, naming the setting."""
    async with App(cfg(address)) as app:
        alice = ctx(mastra__resourceId="alice", responseCache=entry) if entry else ctx(mastra__resourceId=7)
        with pytest.raises(ProcessorFailedError, match=re.escape(named)):
            await call(app, "q", options=alice)
        assert model_requests(app) == []


async def test_default_scope_is_the_memory_resource(address: str, tmp_path: Path) -> None:
    # The resource a memory call names (CallOptions.resource_id, the HTTP body's memory.resource)
    # scopes the cache with no option set: one user's cached answer never reaches another.
    config = make_config(address, input_processors=[ref("response-cache")], responses=RESPONSES)
    agent = config.agents["a"].model_copy(update={"memory": AgentMemoryConfig()})
    config = config.model_copy(
        update={"agents": {"a": agent}, "storage": StorageConfig(path=str(tmp_path / "memory.db"))}
    )

    def on(thread: str, resource: str) -> CallOptions:
        return CallOptions(thread_id=thread, resource_id=resource)

    # (the sidecar's cache lives as long as this module's sidecar: the names are this test's own)
    async with App(config) as app:
        assert (await call(app, "memory q", options=on("a1", "m-alice"))).result.text == "first answer"
        assert (await call(app, "memory q", options=on("b1", "m-bob"))).result.text == "second answer"
        assert (await call(app, "memory q", options=on("a2", "m-alice"))).result.text == "first answer"  # hit
        assert len(model_requests(app)) == 2


async def test_every_step_of_a_tool_loop_is_cached(address: str) -> None:
    tools = {"lookup": {"result": {"v": 1}}}
    responses = [{"toolCalls": [{"name": "lookup", "args": {"q": "x"}}]}, {"text": "looked up"}]
    config = make_config(
        address, input_processors=[ref("response-cache", scope="t-loop")], responses=responses, tools=tools
    )
    async with App(config) as app:
        first = await call(app, "look it up")
        second = await call(app, "look it up")
        assert first.result.text == second.result.text == "looked up"
        assert len(model_requests(app)) == 2  # two steps once; the repeat hit the cache at both steps
        assert [s["toolCalls"][0]["toolName"] for s in second.result.steps[:1]] == ["lookup"]


TTL = 1.5


async def test_ttl_expires_entries(address: str) -> None:
    # the second call must come within the ttl: 0.3 s was too short for a loaded machine
    async with App(cfg(address, scope="t-ttl", ttl=TTL)) as app:
        assert (await call(app, "q")).result.text == "first answer"
        assert (await call(app, "q")).result.text == "first answer"
        await asyncio.sleep(TTL + 0.1)  # time must pass for a ttl; only a longer wait is possible
        assert (await call(app, "q")).result.text == "second answer"


async def test_redis_backend_shares_entries_and_writes_ttl_in_ms(
    address: str, redis_server: RedisServer
) -> None:
    options = {"backend": "redis", "url": redis_server.url, "ttl": 120, "scope": None}
    async with App(cfg(address, **options)) as one:
        assert (await call(one, "shared question")).result.text == "first answer"
    async with App(cfg(address, **options)) as other:  # another orchestrator, same Redis
        assert (await call(other, "shared question")).result.text == "first answer"
        assert model_requests(other) == []
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        keys = await client.keys("procmesh:agent-response:a:*")
        assert len(keys) == 1
        assert 110_000 < await client.pttl(keys[0]) <= 120_000
        stored = json.loads(await client.get(keys[0]))
        assert [c["type"] for c in stored["chunks"]] == ["text-delta", "finish"]
    finally:
        await client.aclose()


async def test_redis_down_never_fails_the_run(address: str, tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/nobody-listens.sock"
    async with App(cfg(address, backend="redis", url=url)) as app:
        assert (await call(app, "q")).result.text == "first answer"
        assert (await call(app, "q")).result.text == "second answer"  # no cache, but no failure


# -- the seeds' rules: a failed run is never cached; a hit does not run the tools again ----------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def with_guards(start_sidecar: Callable[..., SidecarProcess]) -> str:
    """response-cache next to processors that reject steps and results, in one sidecar process."""
    proc = start_sidecar("response-cache", "examples", "regex-filter", name="response-cache-guards")
    await proc.wait_ready()
    return proc.address


def guarded(address: str, responses: list[dict], *, output: list[dict], **agent: object) -> object:
    return make_config(
        address,
        input_processors=[ref("response-cache", scope=None)],
        output_processors=output,
        responses=responses,
        **agent,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("retries", [0, 2], ids=["aborted", "retried"])
async def test_a_step_process_output_step_rejected_is_never_served(with_guards: str, retries: int) -> None:
    responses = [{"text": "far too many words here"}, {"text": "short"}, {"text": "fine"}]
    check = ref("length-check", max_words=2)
    config = guarded(with_guards, responses, output=[check], max_processor_retries=retries)
    async with App(config) as app:
        first = await call(app, f"q-step-{retries}")
        assert (first.result.tripwire is None) is (retries > 0)  # retried: the second try passed
        second = await call(app, f"q-step-{retries}")
        # the rejected answer was not cached: the same question reaches the model again
        assert second.requests, "the rejected step was served from the cache"
        assert second.result.tripwire is None
        assert second.result.text == ("fine" if retries else "short")


@pytest.mark.parametrize("also_output", [False, True], ids=["input-lane", "both-lanes"])
async def test_a_run_process_output_result_rejected_leaves_no_entry(
    with_guards: str, also_output: bool
) -> None:
    # each streamed word alone passes the stream check (no carry-over); the whole answer does not
    block = ref("regex-filter", rules=[{"name": "both", "pattern": "first answer"}], stream_carryover_size=0)
    # listed in the output lane too, before the blocking processor: its place there does not count
    output = [ref("response-cache", scope=None), block] if also_output else [block]
    question = f"q-result-{also_output}"
    async with App(guarded(with_guards, RESPONSES, output=output)) as app:
        first = await call(app, question, stream=True)
        assert first.result.tripwire is not None
        assert first.result.tripwire["processorId"] == "regex-filter"
        second = await call(app, question, stream=True)
        assert second.result.tripwire is None
        assert second.result.text == "second answer"
        assert len(model_requests(app)) == 2
        assert (await call(app, question)).result.text == "second answer"  # the clean run was cached
        assert len(model_requests(app)) == 2


async def test_a_run_that_fails_after_a_clean_step_leaves_no_entry(with_guards: str) -> None:
    lookup = [{"toolCalls": [{"name": "lookup", "args": {"q": "x"}}]}]
    failure = [{"error": {"status": 400, "message": "bad request"}}]
    responses = [*lookup, *failure, {"text": "done"}]
    tools = {"lookup": {"result": {"v": 1}}}
    async with App(guarded(with_guards, responses, output=[], tools=tools)) as app:
        with pytest.raises(APICallError, match="bad request"):
            await call(app, "q-fail")
        [step_zero, _] = model_requests(app)
        second = await call(app, "q-fail")
        # step 0 was not cached by the failed run: the model is asked it again, and answers it
        assert [r.prompt for r in second.requests] == [step_zero.prompt]
        assert second.result.text == "done"
        assert len(second.result.steps) == 1


async def test_a_hit_replays_tool_results_without_running_the_tool(with_guards: str) -> None:
    # the tool announces each execution with a data chunk
    tools = {"lookup": {"result": {"v": 1}, "custom": {"type": "data-lookup-ran", "data": {}}}}
    responses = [{"toolCalls": [{"name": "lookup", "args": {"q": "x"}}]}, {"text": "looked up"}]
    async with App(guarded(with_guards, responses, output=[], tools=tools)) as app:
        first = await call(app, "q-tools", stream=True)
        second = await call(app, "q-tools", stream=True)
        assert second.requests == []  # both steps were hits
        assert first.kinds().count("data-lookup-ran") == 1
        assert "data-lookup-ran" not in second.kinds()  # replayed, not executed
        assert second.result.steps == first.result.steps
        assert second.result.text == "looked up"

        def trace(outcome: object) -> list[object]:
            return [
                (c["type"], c.get("payload"))
                for c in outcome.chunks  # type: ignore[attr-defined]
                if c["type"] not in ("start", "data-lookup-ran")
            ]

        assert trace(second) == trace(first)


async def test_a_hit_is_replayed_through_the_stream_lane(with_guards: str) -> None:
    # K22 (deliberate): a cached answer passes process_output_stream like the live one did, so a
    # hit never shows the caller what a stream guard removed from the original
    redact = ref(
        "regex-filter", rules=[{"name": "word", "pattern": "first"}], strategy="redact", phase="output"
    )
    async with App(guarded(with_guards, RESPONSES, output=[redact])) as app:
        live = await call(app, "q-stream-lane", stream=True)
        hit = await call(app, "q-stream-lane", stream=True)
        assert hit.requests == []  # served from the cache
        assert live.text_deltas() == ["[REDACTED]", " answer"]
        assert hit.text_deltas() == live.text_deltas()


async def test_models_differing_only_by_spec_version_do_not_share_an_entry(address: str) -> None:
    # K17: the key's model part is provider:modelId:specVersion, the version the model reports
    def config(version: str) -> Any:
        base = cfg(address, scope="t-spec-version")
        scripted = base.models["scripted"].model_copy(update={"specification_version": version})
        return base.model_copy(update={"models": {"scripted": scripted}})

    answers = []
    for version in ("v2", "v2", "v3"):
        async with App(config(version)) as app:  # a new App, the same cache sidecar
            outcome = await call(app, "which spec?")
            answers.append((outcome.result.text, len(outcome.requests)))
    # the second v2 model is served the first's entry; the v3 model is asked itself
    assert answers == [("first answer", 1), ("first answer", 0), ("first answer", 1)]
