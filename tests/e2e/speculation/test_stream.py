"""The output stream with speculative and fused processors, through real sidecar processes.

Three scripted sidecar processes serve the same processors (all speculative): a lane naming one
processor from each is speculative across sidecars; a lane naming them all from one sidecar is
fused. Each case's trace (every chunk, the result, the violations, what the non-speculative
recorder was given) must be the sequential one.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.processors.speculative_stream import SpeculativeGroup
from procmesh_orchestrator.processors.stream_rpc import StreamCall
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.speculation.test_unary import _plain, speculative_calls, take_log

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

RECORDER = "tests.e2e.speculation.recorder"
DELTAS = ["the ", "secret ", "apple ", "is ", "red ", "and ", "sweet"]


def rule(when: dict[str, Any] | None, *do: dict[str, Any]) -> dict[str, Any]:
    return {"when": when or {}, "do": list(do)}


PROCESSORS: list[dict[str, Any]] = [
    {"id": "pass", "speculative": True, "processOutputStream": [rule(None, {"count": "parts"})]},
    {
        "id": "rw",
        "speculative": True,
        "processOutputStream": [
            rule({"textContains": "apple"}, {"replaceText": {"pattern": "apple", "with": "pear"}})
        ],
    },
    {
        "id": "drop",
        "speculative": True,
        "processOutputStream": [rule({"textContains": "secret"}, {"drop": True})],
    },
    {  # drops the last text delta: the parts after it are of other types
        "id": "dropend",
        "speculative": True,
        "processOutputStream": [rule({"textContains": "sweet"}, {"drop": True})],
    },
    {
        "id": "cnt",
        "speculative": True,
        "processOutputStream": [
            rule(
                {"partType": "text-delta"},
                {"count": "n"},
                {"custom": {"type": "data-count", "dataFromState": "n"}},
            )
        ],
    },
    {
        "id": "gate",
        "speculative": True,
        "processOutputStream": [rule({"textContains": "pear"}, {"abort": {"reason": "no pears"}})],
    },
    {  # aborts on what rw rewrites: given "apple" in advance, its abort is withdrawn
        "id": "applegate",
        "speculative": True,
        "processOutputStream": [rule({"textContains": "apple"}, {"abort": {"reason": "apples"}})],
    },
    {
        "id": "late",
        "speculative": True,
        "processOutputStream": [rule({"textContains": "sweet"}, {"abort": {"reason": "too sweet"}})],
    },
    {  # counts in its state; processOutputResult reads the state its stream ended with
        "id": "total",
        "speculative": True,
        "processOutputStream": [rule({"partType": "text-delta"}, {"count": "n"})],
        "processOutputResult": [rule(None, {"custom": {"type": "data-total", "dataFromState": "n"}})],
    },
]


@pytest.fixture(scope="module")
def sidecars(start_sidecar: Callable[..., SidecarProcess], sidecar_dir: Path) -> dict[str, SidecarProcess]:
    scenario = sidecar_dir / "stream.json"
    scenario.write_text(json.dumps({"agent": {"outputProcessors": PROCESSORS}}))
    procs = {
        f"s{i}": start_sidecar("scripted", "--scenario", str(scenario), name=f"scr{i}") for i in range(3)
    }
    procs["rec"] = start_sidecar(name="recorder", module=RECORDER)
    return procs


def config(
    sidecars: dict[str, SidecarProcess], log: Path, lane: list[str], mode: str, deltas: list[str] = DELTAS
) -> Any:
    """`lane`: processor ids; sequential and speculative modes put each on its own sidecar."""

    def ref(i: int, pid: str) -> dict[str, Any]:
        if pid == "recorder":
            return {"processor": "rec/recorder", "options": {"log": str(log)}}
        if pid == "slow":  # a member whose answers come after the later members'
            return {"processor": "rec/slow", "options": {"log": str(log), "delay": 0.02}}
        # fused: all on one sidecar; both: blocks of two per sidecar, fused, the blocks speculative
        sidecar = {"fused": "s0", "both": f"s{i // 2 % 3}"}.get(mode, f"s{i % 3}")
        entry: dict[str, Any] = {"processor": f"{sidecar}/{pid}"}
        if pid in lane[:i]:  # a second instance of one processor: its own name, state and tripwire id
            entry["name"] = f"{pid}-{i}"
        if mode == "sequential":
            entry["speculative"] = False
        return entry

    return parse_config(
        {
            "sidecars": {name: {"address": proc.address} for name, proc in sidecars.items()},
            "models": {"scripted": {"provider": "scripted", "responses": [{"deltas": deltas}]}},
            "fuse": mode in ("fused", "both"),
            "agents": {
                "a": {
                    "model": "scripted",
                    "errorProcessorDefaults": False,
                    "outputProcessors": [ref(i, p) for i, p in enumerate(lane)],
                }
            },
        },
        "test config",
    )


async def trace(app: App, log: Path) -> dict[str, Any]:
    stream = app.agent("a").stream("hi")
    chunks = [c async for c in stream if c["type"] != "start"]
    result = await stream.result()
    return {
        "chunks": _plain(chunks),
        "text": result.text,
        "tripwire": result.tripwire,
        "violations": result.violations,
        "recorder": take_log(log),
    }


class Sessions:
    """Every output-stream session the App opens on one sidecar (on its real client)."""

    def __init__(self, app: App, sidecar: str) -> None:
        self.count = 0
        client = app.clients[sidecar]
        open_stream = client.open_stream

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return open_stream(*args, **kwargs)

        client.open_stream = counted  # type: ignore[method-assign]


CASES = {
    "pass": ["pass", "cnt", "pass", "recorder"],
    "rewrite": ["rw", "cnt", "recorder"],
    "drop": ["drop", "cnt", "rw", "recorder"],
    "rewrite-then-abort": ["cnt", "rw", "gate", "recorder"],
    "late-abort": ["pass", "late", "cnt", "recorder"],
    # applegate's session ends at its abort on "apple"; rw's "pear" withdraws it: a new session
    # is given the parts applegate committed again, then the rest
    "withdrawn-abort": ["cnt", "rw", "applegate", "pass", "recorder"],
    # runs of plain pass-through answers commit at once (`SpeculativeGroup._passes`): a rewrite,
    # a drop or an abort at part k in the middle of such runs, and a member answering last
    "rewrite-amid-passes": ["pass", "rw", "pass", "pass", "recorder"],
    "drop-amid-passes": ["pass", "drop", "pass", "recorder"],
    "abort-amid-passes": ["pass", "rw", "pass", "gate", "pass", "recorder"],
    "abort-after-passes": ["pass", "pass", "late", "pass", "recorder"],
    "drop-last-amid-passes": ["pass", "dropend", "pass", "total", "recorder"],
    "late-member-passes": ["slow", "pass", "rw", "pass", "recorder"],
    "late-member-rewritten": ["pass", "rw", "slow", "drop", "pass", "recorder"],
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_stream_traces_equal_sequential(
    ready: dict[str, SidecarProcess], tmp_path: Path, case: str
) -> None:
    log = tmp_path / "rec.jsonl"
    traces = {}
    for mode in ("sequential", "speculative", "fused", "both"):
        async with App(config(ready, log, CASES[case], mode)) as app:
            traces[mode] = await trace(app, log)
    assert traces["speculative"] == traces["sequential"]
    assert traces["fused"] == traces["sequential"]
    assert traces["both"] == traces["sequential"]
    assert traces["sequential"]["recorder"] or traces["sequential"]["tripwire"]


LONG = [f"w{i} " for i in range(400)]
LONG[130] = "secret "  # dropped by `drop`
LONG[350] = "apple "  # rewritten by `rw`


@pytest.mark.parametrize(
    "lane",
    [
        ["pass", "pass", "pass", "total"],
        ["pass", "pass", "rw", "pass", "recorder"],
        ["pass", "drop", "pass", "cnt", "recorder"],
    ],
)
async def test_a_long_stream_is_the_sequential_one(
    ready: dict[str, SidecarProcess], tmp_path: Path, lane: list[str]
) -> None:
    """Rounds of parts every member passes on (a group's lane books, `speculative_lane`), to the
    stream's end or to a drop or a rewrite late in it (the books written out with parts in
    flight and members at different parts): the trace, each processor's part series and the
    speculative group's commits are what the sequential pipeline's run gives."""
    log = tmp_path / "rec.jsonl"
    seen = {}
    for mode in ("sequential", "speculative"):
        async with App(config(ready, log, lane, mode, LONG)) as app:
            result = await trace(app, log)
            total = app.metrics.total
            series = {
                (entry, outcome): total("procmesh_stream_parts_total", entry=entry, outcome=outcome)
                for entry in set(lane)
                for outcome in ("in", "out", "rewritten", "dropped")
            }
            timed = {
                entry: app.metrics.total("procmesh_stream_part_added_seconds_count", entry=entry)
                for entry in set(lane)
            }
            calls = speculative_calls(app)
        seen[mode] = (result, series, timed)
        if mode == "speculative":
            assert calls["committed"] >= len(LONG)  # the later members' guesses, confirmed
    assert seen["speculative"] == seen["sequential"]
    result, series, _ = seen["sequential"]
    assert series[("pass", "in")] >= len(LONG)
    assert "pear" in result["text"] if "rw" in lane else "apple" in result["text"]


async def test_a_fused_stream_is_one_session(ready: dict[str, SidecarProcess], tmp_path: Path) -> None:
    log = tmp_path / "rec.jsonl"
    async with App(config(ready, log, ["pass", "rw", "cnt", "recorder"], "fused")) as app:
        sessions = Sessions(app, "s0")
        result = await trace(app, log)
    assert sessions.count == 1  # one stream for the three processors of the step
    counts = [c["data"] for c in result["chunks"] if c["type"] == "data-count"]
    assert counts == [{"n": n} for n in range(1, len(DELTAS) + 1)]  # cnt's own state, attributed right
    assert "pear" in result["text"]


async def test_the_states_a_speculative_stream_ends_with_are_the_runs(
    ready: dict[str, SidecarProcess], tmp_path: Path
) -> None:
    """processOutputResult gets the state each processor's stream ended with, in every mode (a
    speculative group read its members' end states and dropped them: `total` reported 0)."""
    log = tmp_path / "rec.jsonl"
    totals = {}
    for mode in ("sequential", "speculative", "fused", "both"):
        async with App(config(ready, log, ["rw", "total", "pass", "recorder"], mode)) as app:
            result = await trace(app, log)
        totals[mode] = [c["data"] for c in result["chunks"] if c["type"] == "data-total"]
    assert totals == {mode: [{"n": len(DELTAS)}] for mode in totals}


async def test_speculative_stream_counts_commits_and_discards(
    ready: dict[str, SidecarProcess], tmp_path: Path
) -> None:
    log = tmp_path / "rec.jsonl"
    async with App(config(ready, log, ["rw", "cnt", "pass"], "speculative")) as app:
        result = await trace(app, log)
        calls = speculative_calls(app)
    assert "pear" in result["text"]
    assert calls["committed"] > 0
    assert calls["discarded"] > 0  # rw rewrote the apple part: the later stages' answers were withdrawn


async def test_stream_part_series_are_the_sequential_pipelines(
    ready: dict[str, SidecarProcess], tmp_path: Path
) -> None:
    """procmesh_stream_parts_total counts what each processor's committed answers did: a
    speculative group's withdrawn answers are not in it, so it counts what the sequential
    pipeline does. A fused session is counted under its first processor (what the session did)."""
    log = tmp_path / "rec.jsonl"
    parts = {}
    for mode in ("sequential", "speculative", "fused", "both"):
        async with App(config(ready, log, ["rw", "cnt", "pass"], mode)) as app:
            await trace(app, log)
            parts[mode] = {
                (entry, outcome): app.metrics.total(
                    "procmesh_stream_parts_total", entry=entry, outcome=outcome
                )
                for entry in ("rw", "cnt", "pass")
                for outcome in ("in", "out", "rewritten", "dropped")
            }
    assert parts["sequential"][("rw", "rewritten")] >= 1  # rw rewrites the apple part
    assert parts["sequential"][("pass", "in")] >= len(DELTAS)
    assert parts["speculative"] == parts["sequential"]
    sequential = parts["sequential"]
    # fused: the three in one session on one sidecar, counted under rw (what the session did:
    # cnt's data-count chunks come back in its answers as parts)
    assert parts["fused"][("rw", "in")] == sequential[("rw", "in")]
    assert parts["fused"][("rw", "out")] > sequential[("pass", "out")]
    assert [k for k, v in parts["fused"].items() if v and k[0] != "rw"] == []
    # both: rw and cnt fused on one sidecar, pass on another (its own session, as in sequential)
    assert parts["both"][("cnt", "in")] == 0
    assert {o: parts["both"][("pass", o)] for o in ("in", "out")} == {
        o: sequential[("pass", o)] for o in ("in", "out")
    }


@pytest.mark.parametrize("case", ["drop", "rewrite-then-abort", "withdrawn-abort"])
async def test_the_decision_record_is_the_sequential_one(
    ready: dict[str, SidecarProcess], tmp_path: Path, case: str
) -> None:
    """A speculative stream records each processor's committed decision per part (issue 31): the
    same record as the sequential run's, answers withdrawn by a rewrite before it left out."""
    log = tmp_path / "rec.jsonl"
    records = {}
    for mode in ("sequential", "speculative"):
        cfg = config(ready, log, CASES[case], mode).model_dump(by_alias=True, exclude_unset=True)
        cfg["decisions"] = {"record": True}
        cfg["storage"] = {"path": str(tmp_path / f"{mode}.db")}
        async with App(parse_config(cfg, "test config")) as app:
            result = await app.agent("a").generate("hi")
            store = await app.suspended_runs_store()
            decisions = await store.run_decisions(result.run_id)
        # per processor in part order (the stages interleave by scheduling, in either mode)
        records[mode] = sorted((d.entry, d.hook, d.part or 0, d.outcome) for d in decisions)
        take_log(log)
    assert records["speculative"] == records["sequential"]
    outcomes = {outcome for *_, outcome in records["sequential"]}
    assert {"pass", "drop" if case == "drop" else "rewrite"} <= outcomes


@pytest.mark.parametrize("mode", ["speculative", "sequential", "fused"])
async def test_a_runs_parts_are_let_go_when_it_ends(
    ready: dict[str, SidecarProcess], tmp_path: Path, mode: str
) -> None:
    """What a run's stages held of its parts is freed when the run ends, not left to the cycle
    collector: a speculative group and its members refer to each other, and each member kept
    every part it committed (its `replay`) until a full collection walked them all."""
    deltas = [f"w{i} " for i in range(300)]
    log = tmp_path / "rec.jsonl"
    async with App(config(ready, log, ["pass", "pass", "pass"], mode, deltas)) as app:
        gc.collect()
        gc.disable()
        try:
            stream = app.agent("a").stream("hi")
            async for _ in stream:
                pass
            result = await stream.result()
            alive = sum(1 for o in gc.get_objects() if type(o) is tpb.Chunk)
        finally:
            gc.enable()
    assert result.text == "".join(deltas)
    assert alive < 20, f"{alive} stream parts still held after the run"


async def test_a_rounds_parts_are_encoded_once_for_every_member(
    ready: dict[str, SidecarProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The members of a speculative group get each part at once: each round's parts are encoded
    once, and every member writes those bytes (issue 32: no protobuf copy per member)."""
    asked: list[bytes] = []
    built: list[bytes] = []
    encoded = SpeculativeGroup.encoded

    def counted(group: SpeculativeGroup, parts: list[tuple[int, Any]]) -> bytes:
        before = len(group._encodings)
        data = encoded(group, parts)
        asked.append(data)
        if len(group._encodings) > before:
            built.append(data)
        return data

    monkeypatch.setattr(SpeculativeGroup, "encoded", counted)
    log = tmp_path / "rec.jsonl"
    async with App(config(ready, log, ["pass", "pass", "pass", "recorder"], "speculative")) as app:
        result = await trace(app, log)
    assert result["text"] == "".join(DELTAS)
    assert built
    assert len(asked) == 3 * len(built)  # the three members, one encoding


async def test_parts_that_waited_go_to_each_member_in_one_message(
    ready: dict[str, SidecarProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scripted model's deltas all arrive before the group's first turn: every member gets
    them in one message (what waited goes at once, issue 32 item 2), not one message per part."""
    rounds: list[int] = []
    encoded = SpeculativeGroup.encoded

    def counted(group: SpeculativeGroup, parts: list[tuple[int, Any]]) -> bytes:
        if not any(same == parts for same, _ in group._encodings):
            rounds.append(len(parts))
        return encoded(group, parts)

    monkeypatch.setattr(SpeculativeGroup, "encoded", counted)
    log = tmp_path / "rec.jsonl"
    async with App(config(ready, log, ["pass", "cnt", "pass"], "speculative")) as app:
        result = await trace(app, log)
    assert result["text"] == "".join(DELTAS)
    assert rounds[0] >= len(DELTAS)  # the first message carries every delta


async def test_a_commit_mark_goes_alone_only_when_it_frees_something(
    ready: dict[str, SidecarProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 deltas, all there at once, through three speculative members: each member is sent
    them in two messages (`MAX_BATCH`) and answers 256 first. A ``committed_through`` alone (a
    write, the sidecar's empty answer, its read) goes only once everything sent to the member is
    committed, never while parts are in flight (their records are held anyway; the next parts
    carry the mark): issue 32, 12 of a 1,000-delta run's 24 writes were such marks."""
    sent: dict[int, int] = {}  # parts sent per call (seqs 1..n: nothing is withdrawn here)
    alone: list[tuple[int, int]] = []  # (committed_through, parts sent on that call by then)
    write = StreamCall.write

    async def recorded(call: StreamCall, request: Any) -> None:
        req = ppb.ProcessOutputStreamRequest.FromString(request)
        sent[id(call)] = sent.get(id(call), 0) + len(req.parts)
        if not req.parts and req.committed_through:
            alone.append((req.committed_through, sent[id(call)]))
        await write(call, request)

    monkeypatch.setattr(StreamCall, "write", recorded)
    deltas = [f"d{i} " for i in range(300)]
    log = tmp_path / "rec.jsonl"
    async with App(config(ready, log, ["pass", "pass", "pass"], "speculative", deltas)) as app:
        result = await trace(app, log)
    assert result["text"] == "".join(deltas)
    assert len(sent) == 3
    assert min(sent.values()) > 256  # each member got every part, in two messages
    assert all(mark == total for mark, total in alone), alone


async def test_data_parts_entering_a_group_go_only_to_members_that_take_them(
    ready: dict[str, SidecarProcess], tmp_path: Path
) -> None:
    """cnt's data-count parts pass the (not speculative) recorder and enter the group of pass
    and total, which do not take data parts: they pass the group by, given to neither member
    (`SpeculativeGroup._take`), so each member's parts are the sequential pipeline's."""
    log = tmp_path / "rec.jsonl"
    parts, texts = {}, {}
    for mode in ("sequential", "speculative"):
        async with App(config(ready, log, ["cnt", "recorder", "pass", "total"], mode)) as app:
            result = await trace(app, log)
            parts[mode] = {
                entry: app.metrics.total("procmesh_stream_parts_total", entry=entry, outcome="in")
                for entry in ("pass", "total")
            }
        texts[mode] = [c["type"] for c in result["chunks"]]
    assert texts["speculative"] == texts["sequential"]
    assert texts["sequential"].count("data-count") == len(DELTAS)  # they went through the group
    assert parts["speculative"] == parts["sequential"]
    assert 0 < parts["sequential"]["pass"] < 2 * len(DELTAS)  # the deltas, not the data parts
