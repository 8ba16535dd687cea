"""token-limiter through a real `procmesh-sidecar token-limiter` process and the agent loop."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config.agents import AgentMemoryConfig
from procmesh_orchestrator.errors import ConfigError, ProcessorFailedError, RequestContextError
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.sidecar_process import SidecarProcess
from procmesh_orchestrator.store import StorageConfig
from tests.e2e.builtins.harness import call, make_config, model_requests, prompt_texts, ref, run, start

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

HISTORY = [
    {"role": "user", "text": "first question about apples " * 10},
    {"role": "assistant", "text": "first answer about apples " * 10},
    {"role": "user", "text": "second question about pears " * 10},
    {"role": "assistant", "text": "second answer about pears " * 10},
    {"role": "user", "text": "And plums?"},
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def address(start_sidecar: Callable[..., SidecarProcess]) -> str:
    return await start(start_sidecar, "token-limiter")


@pytest.mark.parametrize(("counter", "limit"), [("tiktoken", 140), ("estimate", 130)])
async def test_prompt_keeps_system_and_newest_messages(address: str, counter: str, limit: int) -> None:
    cfg = make_config(address, input_processors=[ref("token-limiter", limit=limit, token_counter=counter)])
    out = await run(cfg, HISTORY)
    assert out.result.text == "ok"
    texts = prompt_texts(out.requests[0])
    assert texts[0] == "You are helpful."  # system messages always stay
    assert texts[-1] == "And plums?"
    assert not any("apples" in t for t in texts)  # the oldest history did not fit
    assert any("pears" in t for t in texts)
    # the trim is for this provider call only: the caller's history is not rewritten
    assert out.result.response_messages[-1]["role"] == "assistant"


async def test_prompt_under_the_limit_is_untouched(address: str) -> None:
    cfg = make_config(address, input_processors=[ref("token-limiter", limit=100_000)])
    out = await run(cfg, HISTORY)
    assert len(out.requests[0].prompt) == 1 + len(HISTORY)


async def test_contiguous_stops_at_the_first_message_that_does_not_fit(address: str) -> None:
    history = [
        {"role": "user", "text": "tiny old"},
        {"role": "assistant", "text": "huge " * 200},
        {"role": "user", "text": "newest"},
    ]
    best = await run(make_config(address, input_processors=[ref("token-limiter", limit=60)]), history)
    contiguous = await run(
        make_config(address, input_processors=[ref("token-limiter", limit=60, trim_mode="contiguous")]),
        history,
    )
    assert "tiny old" in prompt_texts(best.requests[0])  # best-fit skips the huge one and keeps going
    assert "tiny old" not in prompt_texts(contiguous.requests[0])
    assert "newest" in prompt_texts(contiguous.requests[0])


async def test_nothing_fits_is_a_clear_tripwire(address: str) -> None:
    cfg = make_config(address, input_processors=[ref("token-limiter", limit=40)])
    out = await run(cfg, "word " * 200)
    assert out.requests == []  # the model is never called
    assert out.result.finish_reason == "other"
    trip = out.result.tripwire
    assert trip is not None
    assert trip["processorId"] == "token-limiter"
    assert "No messages fit within the remaining token budget" in trip["reason"]
    assert trip["metadata"]["limit"] == 40


async def test_system_messages_alone_over_the_limit(address: str) -> None:
    cfg = make_config(
        address, input_processors=[ref("token-limiter", limit=20)], instructions="Be exhaustive. " * 30
    )
    out = await run(cfg, "hi", stream=True)
    assert out.kinds()[-1] == "tripwire"
    assert "System messages alone exceed token limit" in out.chunks[-1]["payload"]["reason"]


async def test_this_runs_tool_calls_and_results_are_kept_as_pairs(address: str) -> None:
    tools = {"lookup": {"description": "Look up a fact.", "result": {"fact": "plums are purple " * 20}}}
    responses: list[dict[str, Any]] = [
        {"toolCalls": [{"name": "lookup", "args": {"q": "plums"}}]},
        {"text": "Purple."},
    ]
    cfg = make_config(
        address, input_processors=[ref("token-limiter", limit=230)], responses=responses, tools=tools
    )
    out = await run(cfg, HISTORY)
    assert out.result.text == "Purple."
    second = out.requests[1].prompt
    roles = [m["role"] for m in second]
    # the tool call and its (long) result both reach the model: counted first, never trimmed
    assert roles[-2:] == ["assistant", "tool"]
    assert second[-1]["content"][0]["output"] == {"fact": "plums are purple " * 20}
    assert not any("apples" in t for t in prompt_texts(out.requests[1]))


async def test_stream_truncation_with_one_transient_notice(address: str) -> None:
    text = "one two three four five six seven eight nine ten"
    cfg = make_config(address, output_processors=[ref("token-limiter", limit=4)], responses=[{"text": text}])
    out = await run(cfg, stream=True)
    notices = [c for c in out.chunks if c["type"] == "data-token-limit-reached"]
    assert len(notices) == 1
    assert notices[0]["transient"] is True
    assert notices[0]["data"]["processorId"] == "token-limiter"
    assert notices[0]["data"]["limit"] == 4
    assert "".join(out.text_deltas()) == "one two three four"  # o200k: one token per word
    assert out.result.text == "one two three four"
    assert out.kinds()[-1] == "finish"  # truncation does not end the run


async def test_generate_truncates_the_single_answer_chunk(address: str) -> None:
    cfg = make_config(
        address,
        output_processors=[ref("token-limiter", limit=3)],
        responses=[{"text": "alpha beta gamma delta epsilon"}],
    )
    out = await run(cfg)
    assert out.result.text == "alpha beta gamma"


async def test_abort_strategy_ends_the_stream(address: str) -> None:
    cfg = make_config(
        address,
        output_processors=[ref("token-limiter", limit=5, strategy="abort")],
        responses=[{"text": "a b c d e f g h i j"}],
    )
    out = await run(cfg, stream=True)
    assert out.kinds()[-1] == "tripwire"
    assert out.chunks[-1]["payload"]["reason"].startswith("Token limit of 5 exceeded")
    assert "".join(out.text_deltas()) == "a b c d e"


async def test_part_count_mode_limits_each_chunk(address: str) -> None:
    cfg = make_config(
        address,
        output_processors=[ref("token-limiter", limit=2, count_mode="part")],
        responses=[{"deltas": ["one two", " three four five", " six"]}],
    )
    out = await run(cfg, stream=True)
    assert out.text_deltas() == ["one two", " three four", " six"]


async def test_non_text_chunks_are_never_counted_or_withheld(address: str) -> None:
    tools = {"lookup": {"result": "x"}}
    cfg = make_config(
        address,
        output_processors=[ref("token-limiter", limit=1)],
        responses=[{"text": "calling now", "toolCalls": [{"name": "lookup", "args": {}}]}, {"text": "done"}],
        tools=tools,
    )
    async with App(cfg) as app:
        out = await call(app, stream=True)
    kinds = out.kinds()
    assert "tool-call" in kinds
    assert "tool-result" in kinds
    assert out.result.steps[0]["toolResults"][0]["result"] == "x"


async def test_invalid_options_are_refused(address: str) -> None:
    # refused at start-up against the published options schema, or else by the processor on the call
    cfg = make_config(address, input_processors=[ref("token-limiter", limit=0)])
    with pytest.raises((ConfigError, ProcessorFailedError), match="token-limiter") as info:
        await run(cfg)
    assert "limit" in str(info.value)


async def test_memory_only_trims_the_loaded_history_and_never_the_store(address: str, tmp_path: Path) -> None:
    limiter = ref("token-limiter", limit=200, trim_mode="memory-only", token_counter="estimate")
    responses: list[dict[str, Any]] = [{"text": f"answer {n} " + "lorem " * 30} for n in range(4)]
    config = make_config(address, input_processors=[limiter], responses=responses)
    agent = config.agents["a"].model_copy(update={"memory": AgentMemoryConfig(last_messages=20)})
    config = config.model_copy(
        update={"agents": {"a": agent}, "storage": StorageConfig(path=str(tmp_path / "memory.db"))}
    )
    on_thread = CallOptions(thread_id="t1", resource_id="alice")
    async with App(config) as app:
        for n in range(3):
            await call(app, f"question {n} " + "ipsum " * 30, options=on_thread)
        last = await call(app, "question 3, short", options=on_thread)
        assert app.store is not None
        stored = await app.store.messages("t1", "alice")
    texts = prompt_texts(last.requests[0])
    assert texts[-1] == "question 3, short"  # this call's input is never trimmed
    assert not any(t.startswith("question 0") for t in texts)  # the oldest history went first
    assert any(t.startswith("answer 2") for t in texts)  # the newest stayed
    assert len(stored) == 8  # the store keeps everything: memory-only trims the prompt's copy


async def test_an_unknown_option_key_is_refused_at_start_up(address: str) -> None:
    # the published schema is closed to unknown keys, so a typo fails the start-up naming the
    # entry and the key, instead of passing /readyz and then failing every run
    cfg = make_config(address, input_processors=[ref("token-limiter", limit=100, limt=5)])
    with pytest.raises(ConfigError, match="token-limiter") as info:
        await run(cfg)
    assert "inputProcessors.0.options" in str(info.value)
    assert "'limt' was unexpected" in str(info.value)


def per_tenant_limit(default: int = 100_000) -> dict[str, Any]:
    return ref("token-limiter", limit={"fromContext": "tokenLimit", "default": default})


async def test_an_option_from_the_request_context_differs_per_run(address: str) -> None:
    # the seeds' new TokenLimiter(requestContext.get('tokenLimit') ?? 4000), on one App
    async with App(make_config(address, input_processors=[per_tenant_limit()])) as app:
        small = await call(app, HISTORY, options=CallOptions(request_context={"tokenLimit": 140}))
        default = await call(app, HISTORY)
        big = await call(app, HISTORY, options=CallOptions(request_context={"tokenLimit": 100_000}))
    assert not any("apples" in t for t in prompt_texts(small.requests[0]))  # trimmed to 140 tokens
    for whole in (default, big):
        assert len(whole.requests[0].prompt) == 1 + len(HISTORY)


async def test_a_bad_value_from_the_context_fails_the_run_before_any_hook_naming_option_and_key(
    address: str,
) -> None:
    async with App(make_config(address, input_processors=[per_tenant_limit()])) as app:
        with pytest.raises(RequestContextError) as info:
            await call(app, HISTORY, options=CallOptions(request_context={"tokenLimit": "lots"}))
        assert model_requests(app) == []  # nothing of the run was called
    message = str(info.value)
    assert "processor 'token-limiter': option limit (request-context key 'tokenLimit')" in message
    assert "'lots'" in message


async def test_a_context_option_without_a_default_is_left_out_when_the_run_has_none(address: str) -> None:
    counter = ref("token-limiter", limit=100_000, token_counter={"fromContext": "counter"})
    async with App(make_config(address, input_processors=[counter])) as app:
        assert (await call(app, HISTORY)).result.status == "success"  # the limiter's own counter
        chosen = CallOptions(request_context={"counter": "estimate"})
        assert (await call(app, HISTORY, options=chosen)).result.status == "success"
        with pytest.raises(
            RequestContextError, match="option token_counter \\(request-context key 'counter'\\)"
        ):
            await call(app, HISTORY, options=CallOptions(request_context={"counter": "bogus"}))


async def test_a_required_option_from_the_context_needs_a_default(address: str) -> None:
    entry = ref("token-limiter", limit={"fromContext": "tokenLimit"})
    with pytest.raises(ConfigError, match="'limit' is a required property"):
        await run(make_config(address, input_processors=[entry]))


@pytest.mark.parametrize(
    ("limit", "named"),
    [
        ({"fromContext": "tokenLimit", "default": 0}, "inputProcessors.0.options.limit"),
        ({"fromContext": "", "default": 5}, "inputProcessors.0.options.limit: an option from the request"),
        ({"fromContext": "k", "fallback": 5}, "unknown keys ['fallback']"),
    ],
)
async def test_a_bad_context_option_is_refused_at_start_up(address: str, limit: Any, named: str) -> None:
    entry = ref("token-limiter", limit=limit)
    with pytest.raises(ConfigError) as info:
        await run(make_config(address, input_processors=[entry]))
    assert named in str(info.value)
