"""procmesh-check-sidecar without a sidecar: its hook lists come from the table, its requests are valid."""

from __future__ import annotations

import io

import pytest
from google.protobuf.message import DecodeError

from procmesh import hooks
from procmesh._check import requests
from procmesh._check.problems import abort_problems, effects_problems, new_kind_problems, response_problems
from procmesh._check.report import Report
from procmesh.check import check_sidecar
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb


def test_the_checkers_hook_lists_derive_from_the_table() -> None:
    assert {h.enum: h.rpc for h in hooks.HOOKS} == requests.HOOKS
    assert requests.STREAM == "ProcessOutputStream"
    assert [h.rpc for h in hooks.HOOKS if not h.streaming] == requests.UNARY
    assert set(requests.BUILDERS) == set(requests.UNARY)
    # The hooks whose requests carry messages, as the checker listed them by hand before the table.
    assert {
        "ProcessInput",
        "ProcessInputStep",
        "ProcessOutputStep",
        "ProcessToolResult",
        "ProcessOutputResult",
        "ProcessAPIError",
        "ExecuteTool",
    } == requests.WITH_MESSAGES
    assert {"ProcessInputStep", "ProcessOutputStep"} == requests.RETRYABLE


@pytest.mark.parametrize("rpc", requests.UNARY)
def test_every_unary_hook_gets_a_request_the_sdk_decodes(rpc: str) -> None:
    hook = hooks.BY_RPC[rpc]
    ctx = tpb.RunContext(processor_id="p")
    req = requests.build_request(rpc, ctx, requests.PLAIN_TEXT)
    assert isinstance(req, hook.request)
    assert req.context.processor_id == "p"
    assert set(hook.decode(req)) <= hook.arguments


@pytest.mark.parametrize("rpc", sorted(requests.WITH_MESSAGES))
def test_the_new_kind_variant_carries_a_part_the_sdk_passes_through(rpc: str) -> None:
    req = requests.build_request(rpc, tpb.RunContext(), "x", new_kind=True)
    parts = [p for m in req.messages for p in m.content.parts]
    assert [p.SerializeToString() for p in parts if p.WhichOneof("kind") is None] == [requests.NEW_KIND_PART]
    assert {"type": "procmesh-unknown", "proto": "egoKCHRvbW9ycm93"} in _dicts(hooks.BY_RPC[rpc].decode(req))


def _dicts(value: object) -> list[dict[str, object]]:
    """Every dict inside `value` (lists, dicts, a MessageList's messages)."""
    if isinstance(value, dict):
        return [value, *(d for v in value.values() for d in _dicts(v))]
    if isinstance(value, list | tuple):
        return [d for v in value for d in _dicts(v)]
    if hasattr(value, "get_all"):
        return _dicts(value.get_all())
    return []


def test_a_returned_message_without_its_new_kind_part_is_a_problem() -> None:
    req = requests.build_request("ProcessInput", tpb.RunContext(), "x", new_kind=True)
    kept = ppb.ProcessInputResponse(replace_messages=True, messages=list(req.messages))
    assert new_kind_problems(kept) == []
    assert response_problems("ProcessInput", kept) == []  # the part without a known kind is the one sent
    dropped = ppb.ProcessInputResponse(replace_messages=True, messages=list(req.messages))
    del dropped.messages[0].content.parts[1]
    assert new_kind_problems(dropped) == [
        "messages returns message 'check-new-kind' without its part of a newer kind, as sent"
    ]
    dropped.messages[0].content.parts.add()  # an empty part instead: not the one sent
    assert "messages[0] part 1 has no kind" in response_problems("ProcessInput", dropped)


def test_the_corrupt_bytes_are_no_request() -> None:
    with pytest.raises(DecodeError):
        tpb.Message.FromString(requests.CORRUPT_BYTES)


def test_the_stream_has_no_unary_request() -> None:
    with pytest.raises(ValueError, match="no request for ProcessOutputStream"):
        requests.build_request("ProcessOutputStream", tpb.RunContext(), "x")


def test_effects_problems_name_what_is_malformed() -> None:
    effects = tpb.HookEffects()
    effects.custom_chunks.add(type="text-delta")
    effects.signals.add(type="shout", contents="hi")
    assert effects_problems(effects) == [
        "custom chunk type 'text-delta' does not start with 'data-'",
        "unknown signal type 'shout'",
    ]


def test_a_retry_outside_the_step_hooks_is_described_as_kept() -> None:
    problems, desc = abort_problems("ProcessInput", tpb.Abort(reason="no", retry=True))
    assert problems == []
    assert "kept in the tripwire" in desc


def test_the_report_prints_each_line_and_a_summary() -> None:
    out = io.StringIO()
    report = Report(out)
    assert report.check("a", [], "fine")
    assert not report.check("b", ["x", "y"])
    report.add("SKIP", "c", "why")
    assert out.getvalue().splitlines() == ["PASS  a: fine", "FAIL  b: x; y", "SKIP  c: why"]
    assert report.summary() == "1 passed, 1 failed, 1 skipped"


@pytest.mark.parametrize(
    ("options", "message"),
    [("{not json", "--options is not JSON"), ("[1]", "--options must be a JSON object")],
)
def test_bad_options_are_a_usage_error(
    options: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        check_sidecar(["127.0.0.1:1", "--options", options], prog="procmesh check-sidecar")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith("usage: procmesh check-sidecar ")
