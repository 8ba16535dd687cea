"""The Processor base class and the objects a hook is handed, without a server."""

from __future__ import annotations

from typing import Any

import pytest

from procmesh import HOOK_NAMES, MessageList, Processor, ProcessorServer, TripWire, Writer
from procmesh._processor import HOOK_ARGUMENTS, HookEffects, hook_parameters
from procmesh.errors import InvalidInputError

# -- hook discovery ----------------------------------------------------------------


class _Streamer(Processor):
    id = "streamer"

    # Defined out of HOOK_NAMES order on purpose.
    async def process_output_stream(self, part: dict[str, Any], abort: Any) -> dict[str, Any]:
        return part

    async def process_input(self, messages: list[dict[str, Any]]) -> None:
        return None

    async def helper(self) -> None:
        """Not a hook."""


class _Derived(_Streamer):
    async def process_api_error(self, **kwargs: Any) -> None:
        return None


def test_implemented_hooks_lists_overrides_in_hook_order() -> None:
    assert _Streamer.implemented_hooks() == ["process_input", "process_output_stream"]


def test_implemented_hooks_includes_inherited_hooks() -> None:
    assert _Derived.implemented_hooks() == ["process_input", "process_output_stream", "process_api_error"]


def test_base_processor_implements_no_hook() -> None:
    assert Processor.implemented_hooks() == []
    assert all(not hasattr(Processor, name) for name in HOOK_NAMES)


def test_hook_parameters_of_a_bound_method_are_its_keyword_names() -> None:
    assert hook_parameters(_Streamer().process_output_stream) == frozenset({"part", "abort"})


def test_hook_parameters_of_a_plain_function_skip_self() -> None:
    assert hook_parameters(_Streamer.process_input) == frozenset({"messages"})


def test_hook_parameters_is_none_for_var_keyword() -> None:
    assert hook_parameters(_Derived().process_api_error) is None


def test_hook_parameters_of_a_hook_taking_nothing_is_empty() -> None:
    async def hook() -> None:
        return None

    assert hook_parameters(hook) == frozenset()


# -- send_signal ---------------------------------------------------------------------


async def test_send_signal_records_a_copy_of_a_valid_signal() -> None:
    effects = HookEffects("p")
    signal = {
        "type": "reactive",
        "contents": "check your sources",
        "tagName": "fact-check",
        "attributes": {"severity": "high", "source.id": 3},
    }
    await effects.send_signal(signal)
    signal["contents"] = "mutated after the call"
    assert effects.signals == [
        {
            "type": "reactive",
            "contents": "check your sources",
            "tagName": "fact-check",
            "attributes": {"severity": "high", "source.id": 3},
        }
    ]


async def test_send_signal_defaults_to_reactive() -> None:
    effects = HookEffects("p")
    await effects.send_signal({"contents": "x"})
    assert effects.signals == [{"contents": "x"}]


@pytest.mark.parametrize(
    ("signal", "message"),
    [
        ({"type": "shout", "contents": "x"}, "unknown signal type 'shout'"),
        ({"type": None, "contents": "x"}, "unknown signal type None"),
        ({"type": "reactive", "contents": 42}, "'contents' must be a string"),
        ({"type": "reactive"}, "'contents' must be a string"),
        ({"type": "reactive", "contents": "x", "tagName": "1starts-with-digit"}, "invalid tagName"),
        ({"type": "reactive", "contents": "x", "tagName": "has space"}, "invalid tagName"),
        ({"type": "reactive", "contents": "x", "tagName": "a<b"}, "invalid tagName"),
        ({"type": "reactive", "contents": "x", "tagName": 7}, "invalid tagName"),
        ({"type": "reactive", "contents": "x", "attributes": {"bad name": 1}}, "invalid attribute name"),
        ({"type": "reactive", "contents": "x", "attributes": ["a", "b"]}, "'attributes' must be a dict"),
        ({"type": "reactive", "contents": "x", "metadata": "note"}, "'metadata' must be a dict"),
        ({"type": "state", "contents": "x", "transient": True}, "state signals cannot be transient"),
    ],
)
async def test_send_signal_rejects_invalid_signals(signal: dict[str, Any], message: str) -> None:
    effects = HookEffects("p")
    with pytest.raises(InvalidInputError, match=message):
        await effects.send_signal(signal)
    assert effects.signals == []


@pytest.mark.parametrize("signal", ["contents", None, [("type", "reactive")]])
async def test_send_signal_rejects_non_dicts(signal: Any) -> None:
    with pytest.raises(InvalidInputError, match="expects a dict"):
        await HookEffects("p").send_signal(signal)


async def test_non_transient_state_signal_is_accepted() -> None:
    effects = HookEffects("p")
    await effects.send_signal({"type": "state", "contents": "x", "transient": False})
    assert len(effects.signals) == 1


# -- writer --------------------------------------------------------------------------


async def test_writer_custom_records_data_chunks() -> None:
    effects = HookEffects("p")
    chunk = {"type": "data-progress", "data": {"pct": 50}, "transient": True}
    await Writer(effects).custom(chunk)
    assert effects.custom_chunks == [chunk]


@pytest.mark.parametrize(
    "chunk",
    [
        {"type": "text-delta", "payload": {"text": "x"}},
        {"type": "data", "data": 1},
        {"type": "Data-x", "data": 1},
        {"data": 1},
        {"type": None},
        "data-x",
    ],
)
async def test_writer_custom_rejects_non_data_chunks(chunk: Any) -> None:
    effects = HookEffects("p")
    with pytest.raises(InvalidInputError, match="must start with 'data-'"):
        await Writer(effects).custom(chunk)
    assert effects.custom_chunks == []


# -- abort and violations ---------------------------------------------------------------


def test_abort_default_reason_names_the_processor() -> None:
    with pytest.raises(TripWire) as info:
        HookEffects("pii-guard").abort_hook()
    assert info.value.reason == "Tripwire triggered by pii-guard"
    assert str(info.value) == "Tripwire triggered by pii-guard"
    assert info.value.retry is False
    assert info.value.metadata is None


def test_abort_carries_reason_retry_and_metadata() -> None:
    with pytest.raises(TripWire) as info:
        HookEffects("p").abort_hook("too long", retry=True, metadata={"limit": 10})
    assert (info.value.reason, info.value.retry, info.value.metadata) == ("too long", True, {"limit": 10})


def test_abort_with_empty_reason_uses_the_default() -> None:
    with pytest.raises(TripWire, match=r"^Tripwire triggered by p$"):
        HookEffects("p").abort_hook("")


def test_report_violation_records_without_aborting() -> None:
    effects = HookEffects("p")
    effects.report_violation("mild language", {"score": 0.3})
    effects.report_violation("another")
    assert effects.violations == [("mild language", {"score": 0.3}), ("another", None)]
    assert effects.abort is None


# -- MessageList ---------------------------------------------------------------------


def _msg(msg_id: str, text: str = "t") -> dict[str, Any]:
    return {"id": msg_id, "role": "user", "content": {"format": 2, "parts": [{"type": "text", "text": text}]}}


def test_message_list_starts_unmodified_and_copies_its_input() -> None:
    source = [_msg("a"), _msg("b")]
    ml = MessageList(source)
    source.append(_msg("c"))
    assert [m["id"] for m in ml.get_all()] == ["a", "b"]
    assert ml.modified is False


def test_get_all_returns_a_copy() -> None:
    ml = MessageList([_msg("a")])
    ml.get_all().clear()
    assert len(ml.get_all()) == 1
    assert ml.modified is False


def test_add_appends_and_marks_modified() -> None:
    ml = MessageList([_msg("a")])
    ml.add(_msg("b"))
    assert [m["id"] for m in ml.get_all()] == ["a", "b"]
    assert ml.modified is True


def test_add_with_an_existing_id_moves_it_to_the_end() -> None:
    ml = MessageList([_msg("a", "old"), _msg("b")])
    ml.add(_msg("a", "new"))
    assert [(m["id"], m["content"]["parts"][0]["text"]) for m in ml.get_all()] == [("b", "t"), ("a", "new")]


def test_remove_by_ids_marks_modified_only_when_something_was_removed() -> None:
    ml = MessageList([_msg("a"), _msg("b"), _msg("c")])
    ml.remove_by_ids(["zzz"])
    assert ml.modified is False
    ml.remove_by_ids(["a", "c"])
    assert [m["id"] for m in ml.get_all()] == ["b"]
    assert ml.modified is True


def test_replace_keeps_the_position() -> None:
    ml = MessageList([_msg("a"), _msg("b"), _msg("c")])
    ml.replace(_msg("b", "edited"))
    assert [(m["id"], m["content"]["parts"][0]["text"]) for m in ml.get_all()] == [
        ("a", "t"),
        ("b", "edited"),
        ("c", "t"),
    ]
    assert ml.modified is True


def test_replace_of_an_unknown_id_raises_and_leaves_the_list_alone() -> None:
    ml = MessageList([_msg("a")])
    with pytest.raises(InvalidInputError, match="no message with id 'zzz'"):
        ml.replace(_msg("zzz"))
    assert ml.modified is False
    assert [m["id"] for m in ml.get_all()] == ["a"]


# -- hosting rules (ProcessorServer construction opens no socket) -------------------------


class _Colourful(Processor):
    id = "colourful"

    async def process_input(self, messages: list[dict[str, Any]], colour: str) -> None:
        return None


class _NoHooks(Processor):
    id = "idle"


class _NoId(Processor):
    async def process_input(self) -> None:
        return None


def test_a_hook_declaring_an_unknown_argument_is_rejected_at_construction() -> None:
    with pytest.raises(TypeError, match=r"_Colourful\.process_input declares unknown arguments \['colour'\]"):
        ProcessorServer([_Colourful()])


def test_hook_arguments_cover_every_hook() -> None:
    assert set(HOOK_ARGUMENTS) == set(HOOK_NAMES)
    assert all(
        {"abort", "state", "options", "writer", "send_signal"} <= args for args in HOOK_ARGUMENTS.values()
    )


@pytest.mark.parametrize(
    ("hosted", "message"),
    [
        ([_Streamer(), _Streamer()], "two processors share the id 'streamer'"),
        ([_NoHooks()], "processor 'idle' implements no hook"),
        ([_NoId()], "_NoId has no id"),
        ([], "needs at least one processor"),
    ],
)
def test_server_rejects_invalid_processor_sets(hosted: list[Processor], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProcessorServer(hosted)


class _Other(_Derived):
    id = "other"


def test_server_lists_its_processor_ids_in_order() -> None:
    assert ProcessorServer([_Other(), _Streamer()]).processor_ids == ["other", "streamer"]
