"""Fine-grained cases: tool-search, regex-filter, batch-parts, structured-output, signal built-ins."""

from __future__ import annotations

from typing import Any

import pytest

from procmesh import TripWire
from procmesh_sidecars.builtins.batch_parts import BatchParts, BatchPartsOptions, flush_batch
from procmesh_sidecars.builtins.regex_filter import (
    RegexFilter,
    RegexFilterOptions,
    all_rules,
    find_matches,
    redact,
    regions,
)
from procmesh_sidecars.builtins.signals import BackgroundWorkSignals, BackgroundWorkSignalsOptions
from procmesh_sidecars.builtins.structured_output import (
    StructuredOutputOptions,
    parse_json,
    validation_errors,
)
from procmesh_sidecars.builtins.tool_search import BM25, SearchOptions, tokenize
from procmesh_sidecars.builtins.tool_search._index import Catalog
from procmesh_sidecars.builtins.tool_search._meta import load_tool, loaded_from_context
from tests.unit.sidecars.helpers import Signals, Violations, abort

CATALOG = Catalog(
    [
        {"name": "github_create_issue", "description": "Create a new issue in a GitHub repository."},
        {"name": "weather", "description": "Get the current weather for a city."},
        {"name": "send_email", "description": "Send an email to a recipient."},
    ]
)


def test_tokenize_splits_tool_ids() -> None:
    assert tokenize("github_create-issue (v2).x") == ["github", "create", "issue", "v2"]


def test_bm25_prefers_rarer_terms_and_name_boost() -> None:
    index = BM25({"a": "apple banana", "b": "apple cherry", "c": "cherry cherry"})
    hits = dict(index.search("banana apple"))
    assert max(hits, key=hits.__getitem__) == "a"
    results = CATALOG.search("weather", SearchOptions())
    assert results[0]["name"] == "weather"
    assert results[0]["score"] > 5  # exact-name boost
    assert CATALOG.search("nothing-like-it", SearchOptions()) == []
    assert len(CATALOG.search("issue email weather", SearchOptions(top_k=2))) == 2


def test_load_tool_shapes() -> None:
    loaded: list[str] = ["weather"]
    multi = load_tool({"toolNames": ["send_email", "weather", "nope"]}, CATALOG, loaded)
    assert multi == {
        "success": False,
        "message": "Loaded: send_email — available on your next turn"
        " | Already loaded: weather | Not found: nope",
        "loadedCount": 1,
        "loaded": ["send_email"],
        "notFound": ["nope"],
        "alreadyLoaded": ["weather"],
    }
    assert loaded == ["weather", "send_email"]
    assert load_tool({}, CATALOG, loaded)["success"] is False
    assert load_tool({"toolNames": []}, CATALOG, loaded)["message"] == "toolNames array must not be empty."
    assert (
        load_tool({"toolName": "weather"}, CATALOG, loaded)["message"]
        == 'Tool "weather" is already loaded and available.'
    )


def test_context_store_reads_completed_results() -> None:
    def inv(name: str, res: Any) -> dict[str, Any]:
        return {
            "type": "tool-invocation",
            "toolInvocation": {"state": "result", "toolName": name, "toolCallId": "x", "result": res},
        }

    messages = [
        {
            "role": "assistant",
            "content": {
                "parts": [
                    inv("load_tool", {"success": True, "loaded": ["weather"]}),
                    inv(
                        "search_tools", {"results": [{"name": "send_email"}]}
                    ),  # a plain search loads nothing
                    inv("search_tools", {"activation": {"loaded": ["github_create_issue"]}}),
                ]
            },
        }
    ]
    assert loaded_from_context(messages) == ["weather", "github_create_issue"]


def test_regex_regions_merge_overlaps_longest_owner() -> None:
    options = RegexFilterOptions(presets=["pii"])
    rules = all_rules(options)
    text = "card 4111 1111 1111 1111 and mail a@b.co"
    merged = regions(find_matches(text, rules))
    assert [owner.rule.name for _, _, owner in merged] == ["credit-card", "email"]
    assert redact(text, rules) == "card [CREDIT_CARD] and mail [EMAIL]"


async def test_regex_stream_block_across_chunks() -> None:
    processor, state = RegexFilter(), {}
    options = RegexFilterOptions(presets=["secrets"])
    first = {"type": "text-delta", "payload": {"text": "key AKIAABCDEF"}}
    assert await processor.process_output_stream(first, options, state, abort, Violations()) == first
    with pytest.raises(TripWire, match="blocked streaming content matching patterns: aws-key"):
        await processor.process_output_stream(
            {"type": "text-delta", "payload": {"text": "GHIJKLMNOP end"}}, options, state, abort, Violations()
        )


def _delta(text: str) -> dict[str, Any]:
    return {"type": "text-delta", "payload": {"id": "t", "text": text}}


async def test_regex_stream_hold_back_redacts_a_split_match_before_any_of_it_is_sent() -> None:
    processor, state = RegexFilter(), {}
    options = RegexFilterOptions(presets=["pii"], strategy="redact", stream_hold_back=16)
    sent = []
    for piece in ["write to ja", "ne@example.com now, ", "thanks"]:
        out = await processor.process_output_stream(_delta(piece), options, state, abort, Violations())
        sent += [out] if isinstance(out, dict) else (out or [])
    finish = {"type": "step-finish", "payload": {"finishReason": "stop"}}
    end = await processor.process_output_stream(finish, options, state, abort, Violations())
    assert isinstance(end, list)
    assert end[-1] == finish
    sent += end[:-1]
    text = "".join(c["payload"]["text"] for c in sent)
    assert text == "write to [EMAIL] now, thanks"
    assert all("ja" not in c["payload"]["text"] for c in sent)  # no piece of the address went out


async def test_regex_stream_without_hold_back_sends_the_first_piece_as_it_came() -> None:
    processor, state = RegexFilter(), {}
    options = RegexFilterOptions(presets=["pii"], strategy="redact")
    first = await processor.process_output_stream(_delta("write to ja"), options, state, abort, Violations())
    assert first == _delta("write to ja")  # the documented limit hold-back removes


def test_regex_non_global_rule_reports_first_match_only() -> None:
    options = RegexFilterOptions(rules=[{"name": "x", "pattern": "x", "flags": ""}])
    assert len(find_matches("x x x", options.rules)) == 1
    with pytest.raises(ValueError, match="invalid pattern"):
        RegexFilterOptions(rules=[{"name": "bad", "pattern": "("}])


async def test_batch_parts_flush_keeps_first_id_and_order() -> None:
    state: dict[str, Any] = {
        "batch": [
            {"type": "text-delta", "payload": {"id": "t1", "text": "a"}},
            {"type": "text-delta", "payload": {"id": "t1", "text": "b"}},
            {"type": "reasoning-delta", "payload": {"text": "r"}},
            {"type": "text-delta", "payload": {"id": "t2", "text": "c"}},
        ]
    }
    assert flush_batch(state) == {"type": "text-delta", "payload": {"text": "ab", "id": "t1"}}
    assert flush_batch(state) == {"type": "reasoning-delta", "payload": {"text": "r"}}
    assert flush_batch(state) == {"type": "text-delta", "payload": {"id": "t2", "text": "c"}}
    assert flush_batch(state) is None


async def test_batch_parts_without_emit_on_non_text_batches_other_parts_but_never_tool_calls() -> None:
    processor, state = BatchParts(), {}
    options = BatchPartsOptions(batch_size=3, emit_on_non_text=False)
    assert (
        await processor.process_output_stream(
            {"type": "reasoning-delta", "payload": {"text": "r"}}, options, state
        )
        is None
    )
    call = {"type": "tool-call", "payload": {"toolCallId": "c", "toolName": "t", "args": {}}}
    # as in the reference, the batch goes out first, then the tool call (never held back)
    assert await processor.process_output_stream(call, options, state) == [
        {"type": "reasoning-delta", "payload": {"text": "r"}},
        call,
    ]
    assert await processor.process_output_stream(call, options, state) == call  # nothing batched


def test_parse_json_variants() -> None:
    assert parse_json('{"a": 1}') == {"a": 1}
    assert parse_json("```json\n[1, 2]\n```") == [1, 2]
    assert parse_json('Here you go: {"a": {"b": 2}} done') == {"a": {"b": 2}}
    with pytest.raises(ValueError, match="Expecting value"):
        parse_json("no json here")


def test_validation_errors_are_readable() -> None:
    schema = StructuredOutputOptions(
        schema={"type": "object", "properties": {"n": {"type": "integer"}}}
    ).schema_
    assert validation_errors({"n": "x"}, schema) == ["$.n: 'x' is not of type 'integer'"]
    assert validation_errors({"n": 1}, schema) == []


async def test_background_work_one_terminal_signal_per_task() -> None:
    processor, state, signals = BackgroundWorkSignals(), {}, Signals()
    options = BackgroundWorkSignalsOptions()

    async def see(call_id: str, work: dict[str, Any]) -> None:
        await processor.process_tool_result(
            "t", call_id, {"_background": work}, "run-1", options, state, signals
        )

    await see("c1", {"taskId": "k", "disposition": "awaited", "status": "completed"})  # unknown task: ignored
    await see("c1", {"taskId": "k", "disposition": "awaited", "status": "running"})
    await see("c1", {"taskId": "k", "disposition": "awaited", "status": "running"})
    await see("c2", {"taskId": "k", "disposition": "deferred", "status": "failed"})  # other disposition
    await see("c2", {"taskId": "k", "disposition": "awaited", "status": "failed"})
    await see("c2", {"taskId": "k", "disposition": "awaited", "status": "completed"})
    assert [
        (s["tagName"], s["metadata"]["status"], s["metadata"]["originToolCallId"]) for s in signals.sent
    ] == [
        ("work-awaited", "running", "c1"),
        ("work-failed", "failed", "c1"),
    ]
    assert signals.sent[0]["metadata"]["originRunId"] == "run-1"
