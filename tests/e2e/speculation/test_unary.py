"""Speculative and fused unary hooks through real sidecar processes: the sequential trace, always.

One scripted sidecar (`procmesh-sidecar scripted`, every processor declared speculative) and one
recorder sidecar (`tests.e2e.speculation.recorder`) serve the module. Each case runs the same
lanes three ways, sequentially (every entry ``speculative: false``, ``fuse: false``),
speculatively, and speculatively with fusion, and the traces (chunks, result, messages,
violations, what the non-speculative recorder was given) must be equal.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from procmesh.hooks import HOOKS
from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.sidecar_process import SidecarProcess

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

RECORDER = "tests.e2e.speculation.recorder"


def rule(when: dict[str, Any] | None, *do: dict[str, Any]) -> dict[str, Any]:
    return {"when": when or {}, "do": list(do)}


def replace(pattern: str, new: str) -> dict[str, Any]:
    return {"replaceText": {"pattern": pattern, "with": new}}


PROCESSORS: list[dict[str, Any]] = [
    {  # rewrites: the ones after it must run again on what it left
        "id": "rw",
        "speculative": True,
        "processInput": [rule({"textContains": "apple"}, replace("apple", "pear"))],
        "processInputStep": [rule({"textContains": "step-rewrite"}, replace("step-rewrite", "stepped"))],
        "processLLMRequest": [rule({"textContains": "pear"}, replace("pear", "plum"))],
        "processOutputStep": [rule(None, {"count": "outsteps"})],
        "processOutputResult": [rule({"textContains": "world"}, replace("world", "earth"))],
    },
    {  # state and custom chunks: a discarded call's count must never show
        "id": "cnt",
        "speculative": True,
        "processInput": [
            rule(None, {"count": "n"}, {"custom": {"type": "data-count", "dataFromState": "n"}})
        ],
        "processInputStep": [
            rule(None, {"count": "n"}, {"custom": {"type": "data-count", "dataFromState": "n"}}),
            rule({"textContains": "signal-me"}, {"signal": {"contents": "a note"}}),
        ],
        "processLLMRequest": [rule(None, {"count": "n"})],
        "processOutputResult": [
            rule(None, {"count": "n"}, {"custom": {"type": "data-count", "dataFromState": "n"}})
        ],
    },
    {  # aborts: everything after it is discarded
        "id": "gate",
        "speculative": True,
        "processInput": [rule({"textContains": "forbidden"}, {"abort": {"reason": "no"}})],
        "processInputStep": [rule({"textContains": "stepped"}, {"abort": {"reason": "no step"}})],
        "processLLMRequest": [rule({"textContains": "plum"}, {"abort": {"reason": "no plums"}})],
        "processOutputResult": [rule({"textContains": "earth"}, {"abort": {"reason": "no earth"}})],
    },
    {
        "id": "tail",
        "speculative": True,
        "processInput": [rule(None, {"count": "seen"})],
        "processLLMRequest": [
            rule({"stateGte": {"key": "seen", "value": 2}}, {"abort": {"reason": "twice"}})
        ],
    },
]


@pytest.fixture(scope="module")
def sidecars(start_sidecar: Callable[..., SidecarProcess], sidecar_dir: Path) -> dict[str, SidecarProcess]:
    scenario = sidecar_dir / "processors.json"
    scenario.write_text(json.dumps({"agent": {"inputProcessors": PROCESSORS}}))
    return {
        "s": start_sidecar("scripted", "--scenario", str(scenario), name="scripted"),
        "rec": start_sidecar(name="recorder", module=RECORDER),
    }


MODES = {
    "sequential": {"speculative": False, "fuse": False},
    "speculative": {"speculative": None, "fuse": False},
    "fused": {"speculative": None, "fuse": True},
}


def config(
    sidecars: dict[str, SidecarProcess],
    log: Path,
    mode: str,
    *,
    input_ids: list[str],
    output_ids: list[str] = (),  # type: ignore[assignment]
    text: str = "hello world",
) -> Any:
    spec = MODES[mode]

    def ref(pid: str) -> dict[str, Any]:
        if pid == "recorder":
            return {"processor": "rec/recorder", "options": {"log": str(log)}}
        entry: dict[str, Any] = {"processor": f"s/{pid}"}
        if spec["speculative"] is False:
            entry["speculative"] = False
        return entry

    return parse_config(
        {
            "sidecars": {name: {"address": proc.address} for name, proc in sidecars.items()},
            "models": {"scripted": {"provider": "scripted", "responses": [{"text": text}]}},
            "fuse": spec["fuse"],
            "agents": {
                "a": {
                    "model": "scripted",
                    "errorProcessorDefaults": False,
                    "inputProcessors": [ref(p) for p in input_ids],
                    "outputProcessors": [ref(p) for p in output_ids],
                }
            },
        },
        "test config",
    )


def _plain(value: Any) -> Any:
    """`value` without the ids and times every run makes anew (message and signal ids)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k not in ("id", "createdAt")}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def take_log(log: Path) -> list[dict[str, Any]]:
    """The JSON lines a processor wrote, and a fresh log for the next run."""
    lines = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return [json.loads(line) for line in lines]


async def trace(app: App, text: str, log: Path) -> dict[str, Any]:
    """What a user can observe of one streamed run, plus what the recorder was given."""
    stream = app.agent("a").stream(text)
    chunks = [c async for c in stream if c["type"] != "start"]  # the start chunk names the run id
    result = await stream.result()
    recorded = take_log(log)
    return {
        "chunks": _plain(chunks),
        "text": result.text,
        "finish": result.finish_reason,
        "tripwire": result.tripwire,
        "violations": result.violations,
        "messages": _plain(result.response_messages),
        "recorder": recorded,
    }


def speculative_calls(app: App) -> Counter[str]:
    out: Counter[str] = Counter()
    for metric in app.metrics.registry.collect():
        if metric.name == "procmesh_speculative_calls":
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["outcome"]] += int(sample.value)
    return out


REQUESTS = {hook.rpc: hook.request for hook in HOOKS}


class RequestLog:
    """Every request the App sends to one sidecar, counted on its real client (the wire is real)."""

    def __init__(self, app: App, sidecar: str) -> None:
        self.requests: list[tuple[str, list[str]]] = []
        client = app.clients[sidecar]
        send = client.call

        async def counted(rpc: str, request: Any, *args: Any, **kwargs: Any) -> Any:
            # the caller sends its requests serialized (`GrpcHookCaller.context_field`)
            context = REQUESTS[rpc].FromString(request).context
            fused = [f.processor_id for f in context.fused]
            self.requests.append((rpc, [context.processor_id, *fused]))
            return await send(rpc, request, *args, **kwargs)

        client.call = counted  # type: ignore[method-assign]


CASES = {
    # input text, input lane, output lane
    "pass": ("hello world", ["rw", "cnt", "gate", "tail", "recorder"], ["cnt", "recorder"]),
    "rewrite-input": ("an apple a day", ["rw", "cnt", "recorder", "gate", "tail"], ["recorder"]),
    "rewrite-then-abort": ("an apple again", ["cnt", "rw", "gate", "recorder", "tail"], []),
    "abort-input": ("forbidden fruit", ["cnt", "gate", "rw", "recorder", "tail"], ["recorder"]),
    "step-rewrite-abort": ("please step-rewrite", ["rw", "cnt", "gate", "recorder"], []),
    "signal": ("signal-me now", ["cnt", "rw", "recorder", "gate"], ["recorder"]),
    "output-rewrite-abort": ("hello", ["recorder"], ["cnt", "rw", "recorder", "gate"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_speculative_and_fused_traces_equal_sequential(
    ready: dict[str, SidecarProcess], tmp_path: Path, case: str
) -> None:
    text, input_ids, output_ids = CASES[case]
    log = tmp_path / "recorder.jsonl"
    traces = {}
    for mode in MODES:
        cfg = config(ready, log, mode, input_ids=input_ids, output_ids=output_ids, text="hello world")
        async with App(cfg) as app:
            traces[mode] = await trace(app, text, log)
    assert traces["speculative"] == traces["sequential"]
    assert traces["fused"] == traces["sequential"]
    sequential = traces["sequential"]
    assert sequential["recorder"] or sequential["tripwire"], "neither recorded nor aborted: it tests nothing"


async def test_rewrite_discards_later_calls_and_counts_them(
    ready: dict[str, SidecarProcess], tmp_path: Path
) -> None:
    log = tmp_path / "recorder.jsonl"
    cfg = config(ready, log, "speculative", input_ids=["rw", "cnt", "tail", "recorder"])
    async with App(cfg) as app:
        result = await trace(app, "an apple a day", log)
        calls = speculative_calls(app)
    # processInput and processLLMRequest: rw rewrote, so cnt's and tail's speculative answers were
    # discarded (2 + 2); the next batch starts at cnt (final input), tail's answer stands (1 + 1).
    # processInputStep: cnt's speculative answer stands (1). The recorder is never speculative.
    assert calls == {"discarded": 4, "committed": 3}, calls
    # cnt counted once per hook that committed: the discarded calls' counts never showed
    counts = [c["data"] for c in result["chunks"] if c["type"] == "data-count"]
    assert counts == [{"n": 2}], counts  # processInput (1) is not streamed; processInputStep is 2
    # tail counted `seen` once: were the discarded call's state kept, processLLMRequest would abort
    assert result["tripwire"] is None
    assert result["finish"] == "stop"
    texts = {r["hook"]: r["text"] for r in result["recorder"]}
    assert texts["process_input"] == "an pear a day"
    assert texts["process_llm_request"] == "an plum a day"


async def test_fused_members_go_in_one_request(ready: dict[str, SidecarProcess], tmp_path: Path) -> None:
    log = tmp_path / "recorder.jsonl"
    cfg = config(ready, log, "fused", input_ids=["rw", "cnt", "tail", "recorder"])
    async with App(cfg) as app:
        requests = RequestLog(app, "s")
        result = await trace(app, "hello world", log)
    assert result["finish"] == "stop"
    by_rpc = Counter(rpc for rpc, _ in requests.requests)
    # nothing rewrote: one request per hook carries all three scripted processors
    assert requests.requests.count(("ProcessInput", ["rw", "cnt", "tail"])) == 1, requests.requests
    assert by_rpc["ProcessInput"] == 1
    assert by_rpc["ProcessLLMRequest"] == 1


async def test_fused_request_resumes_after_a_rewrite(
    ready: dict[str, SidecarProcess], tmp_path: Path
) -> None:
    log = tmp_path / "recorder.jsonl"
    cfg = config(ready, log, "fused", input_ids=["rw", "cnt", "tail", "recorder"])
    async with App(cfg) as app:
        requests = RequestLog(app, "s")
        result = await trace(app, "an apple", log)
    assert result["finish"] == "stop"
    inputs = [members for rpc, members in requests.requests if rpc == "ProcessInput"]
    # rw rewrote: the sidecar stopped after it, the others went again, fused, on the new input
    assert inputs == [["rw", "cnt", "tail"], ["cnt", "tail"]], inputs


async def test_non_speculative_processor_sees_only_final_input(
    ready: dict[str, SidecarProcess], tmp_path: Path
) -> None:
    log = tmp_path / "recorder.jsonl"
    cfg = config(ready, log, "speculative", input_ids=["rw", "recorder", "cnt"], output_ids=["recorder"])
    async with App(cfg) as app:
        result = await trace(app, "apple pie", log)
    seen = [(r["hook"], r["text"]) for r in result["recorder"]]
    assert ("process_input", "pear pie") in seen
    assert all("apple" not in text for _, text in seen), seen


async def test_speculative_calls_overlap(ready: dict[str, SidecarProcess], tmp_path: Path) -> None:
    log = tmp_path / "slow.jsonl"
    slow = [
        {"processor": "rec/slow", "name": f"slow{i}", "options": {"log": str(log), "delay": 0.2}}
        for i in range(3)
    ]
    for mode, expected in (("sequential", 1), ("speculative", 3)):
        entries = [dict(e, speculative=False) if mode == "sequential" else e for e in slow]
        cfg = parse_config(
            {
                "sidecars": {"rec": {"address": ready["rec"].address}},
                "models": {"scripted": {"provider": "scripted", "responses": [{"text": "ok"}]}},
                "agents": {
                    "a": {
                        "model": "scripted",
                        "errorProcessorDefaults": False,
                        "fuse": False,
                        "inputProcessors": entries,
                    }
                },
            },
            "test config",
        )
        async with App(cfg) as app:
            result = await app.agent("a").generate("hi")
        assert result.text == "ok"
        entries_seen = take_log(log)
        peak = max(e["in_flight"] for e in entries_seen if e["hook"] == "process_input")
        assert peak == expected, (mode, entries_seen)


async def test_speculative_true_for_an_undeclared_processor_fails_start_up(
    ready: dict[str, SidecarProcess], tmp_path: Path
) -> None:
    cfg = parse_config(
        {
            "sidecars": {"rec": {"address": ready["rec"].address}},
            "models": {"scripted": {"provider": "scripted", "responses": [{"text": "ok"}]}},
            "agents": {
                "a": {
                    "model": "scripted",
                    "errorProcessorDefaults": False,
                    "inputProcessors": [
                        {"processor": "rec/recorder", "speculative": True, "options": {"log": "x"}}
                    ],
                }
            },
        },
        "test config",
    )
    with pytest.raises(ConfigError, match=r"inputProcessors\.0\.speculative: processor 'rec/recorder'"):
        async with App(cfg):
            pass
