"""The checks of fused requests and rewinds: each must answer what the plain calls answer.

A sidecar whose Describe says ``fuses`` gets fused requests, and the checker makes the same
calls one processor at a time and composes them as the orchestrator would (proto/README.md,
"Fused processors"): the fused answer must be that composition. A speculative processor's
stream gets rewinds, and what it answers after one must be what it answers to the same parts
without it (its results depend only on its input and state: the contract it declares).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import json_format

from procmesh import convert
from procmesh._check.requests import HOOKS, PLAIN_TEXT, STREAM, UNKNOWN_PROCESSOR, build_request, text_delta
from procmesh._check.wire import Code, Wire
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb


@dataclass
class Exchange:
    """One ProcessOutputStream exchange of explicit requests (rewinds included)."""

    results: list[ppb.StreamPartResult] = field(default_factory=list)
    end: ppb.StreamEnd | None = None
    code: Code = Code.OK
    details: str = ""


def _plain(message: Any) -> Any:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _passes(response: Any) -> bool:
    effects = response.effects
    if effects.signals or effects.HasField("abort"):
        return False
    return all(f.name == "effects" for f, _ in response.ListFields())


def _difference(got: Any, want: Any, path: str = "") -> str:
    """Where two JSON values first differ, for a FAIL line ("" when equal)."""
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want)):
            if key not in got or key not in want:
                return f"{path}.{key} only in the {'fused' if key in got else 'plain'} answer"
            found = _difference(got[key], want[key], f"{path}.{key}")
            if found:
                return found
        return ""
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return next(
            (
                d
                for i, (g, w) in enumerate(zip(got, want, strict=True))
                if (d := _difference(g, w, f"{path}[{i}]"))
            ),
            "",
        )
    return "" if got == want else f"{path or 'the answer'}: {got!r} where the plain calls give {want!r}"


def _chunks(res: ppb.StreamPartResult) -> list[tpb.Chunk]:
    return ([res.part] if res.HasField("part") else []) + list(res.extra_parts)


_TOOL_RPC = "ExecuteTool"


class FusionChecks(Wire):
    """Fused requests (for a sidecar that `fuses`) and rewinds (for speculative stream processors)."""

    async def exchange(self, requests: Sequence[ppb.ProcessOutputStreamRequest]) -> Exchange:
        """Send each request and read its answer before the next (rewinds follow answers)."""
        out = Exchange()
        call = self.stub.ProcessOutputStream(timeout=self.timeout + 1.0)
        try:
            for req in requests:
                await call.write(req)
                resp = await call.read()
                if resp is None or not isinstance(resp, ppb.ProcessOutputStreamResponse):
                    break
                out.results += resp.results
                if resp.HasField("end"):
                    out.end = resp.end
                if any(r.effects.HasField("abort") for r in resp.results):
                    break
            await call.done_writing()
            while isinstance(resp := await call.read(), ppb.ProcessOutputStreamResponse):
                out.results += resp.results
                if resp.HasField("end"):
                    out.end = resp.end
        except grpc.aio.AioRpcError as exc:
            out.code, out.details = exc.code(), exc.details() or ""
        except (grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
            out.code, out.details = Code.UNKNOWN, f"stream broke: {exc}"
            call.cancel()
        return out

    def fused_context(self, first: str, *members: str) -> tpb.RunContext:
        ctx = self.context(first)
        for pid in members:
            member = ctx.fused.add(processor_id=pid)
            member.options.CopyFrom(self.processor_options.get(pid, self.options))
            member.state.CopyFrom(convert.to_struct(self.sent_state()))
        return ctx

    async def check_fused(self, described: Sequence[ppb.ProcessorInfo]) -> None:
        """For each hook: the first two processors declaring it (or the one, twice), fused."""
        lanes = [v for v in HOOKS if HOOKS[v] != _TOOL_RPC]  # tools are never fused
        for value in lanes:
            hosting = [i.id for i in described if value in i.hooks]
            if not hosting:
                continue
            hook = HOOKS[value]
            first, second = hosting[0], hosting[1] if len(hosting) > 1 else hosting[0]
            if hook == STREAM:
                await self.check_fused_stream(first, second)
            else:
                await self.check_fused_unary(hook, first, second)
        found = next(((i, v) for i in described for v in i.hooks if v in lanes), None)
        if found is None:
            self.report.add("SKIP", "fused requests", "no processor here implements a lane hook")
            return
        info, value = found
        hook = HOOKS[value]
        ctx = self.fused_context(info.id, UNKNOWN_PROCESSOR)
        if hook == STREAM:
            answer = await self.exchange(self.requests([[text_delta(PLAIN_TEXT)]], ctx))
            code, details = answer.code, answer.details
        else:
            _, code, details = await self.unary(hook, build_request(hook, ctx, PLAIN_TEXT))
        problems = [] if code == Code.NOT_FOUND else [f"expected NOT_FOUND, got {code.name}: {details}"]
        self.report.check(f"fused {hook} naming an unknown processor", problems, f"NOT_FOUND: {details}")

    async def check_fused_unary(self, hook: str, first: str, second: str) -> None:
        name = f"fused {hook} [{first}, {second}]"
        fused, code, details = await self.unary(
            hook, build_request(hook, self.fused_context(first, second), PLAIN_TEXT)
        )
        if code != Code.OK:
            self.report.add("FAIL", name, f"{code.name}: {details}")
            return
        alone, code, details = await self.unary(hook, build_request(hook, self.context(first), PLAIN_TEXT))
        if code != Code.OK:
            self.report.add("FAIL", name, f"{first} alone answered {code.name}: {details}")
            return
        want = _plain(alone)
        ran = "1 ran"
        if _passes(alone):
            then, code, details = await self.unary(
                hook, build_request(hook, self.context(second), PLAIN_TEXT)
            )
            want = {k: v for k, v in want.items() if k != "effects"}
            fx = _plain(alone.effects) if alone.HasField("effects") else {}
            if code == Code.OK:
                want.update({k: v for k, v in _plain(then).items() if k != "effects"})
                outcome = {"effects": _plain(then.effects)}
            else:
                outcome = {"error": "<error>"}
            want["effects"] = {**fx, "fused": [outcome]}
            ran = "both ran"
        got = _plain(fused)
        for outcome in got.get("effects", {}).get("fused", []):
            if "error" in outcome:  # its detail is the processor's own words
                outcome["error"] = "<error>"
        problem = _difference(got, want)
        self.report.check(name, [problem] if problem else [], f"answers what the plain calls answer ({ran})")

    async def check_fused_stream(self, first: str, second: str) -> None:
        name = f"fused {STREAM} [{first}, {second}]"
        words = PLAIN_TEXT.split(" ")
        data = convert.chunk_to_proto({"type": "data-procmesh-check", "data": {"n": 1}})
        batches = [[text_delta(words[0]), text_delta(" " + words[1])], [data, text_delta(" " + words[2])]]
        fused = await self.exchange(self.requests(batches, self.fused_context(first, second)))
        alone = await self.exchange(self.requests(batches, self.context(first)))
        problems = [
            f"{o} answered {e.code.name}: {e.details}"
            for o, e in (("fused", fused), (first, alone))
            if e.code != Code.OK
        ]
        if problems or any(r.effects.HasField("abort") for r in alone.results + fused.results):
            self.report.check(name, problems, "aborted: compared no further")
            return
        # What `first` left, in the pipeline's order (custom chunks, then its parts), through `second`.
        handed = [[*r.effects.custom_chunks, *_chunks(r)] for r in alone.results]
        then = await self.exchange(self.requests([[c for h in handed for c in h]], self.context(second)))
        if then.code != Code.OK:
            self.report.add("FAIL", name, f"{second} alone answered {then.code.name}: {then.details}")
            return
        at = 0
        for i, (res, chunks) in enumerate(zip(fused.results, handed, strict=False)):
            want: list[Any] = []
            for r in then.results[at : at + len(chunks)]:
                want += [_plain(c) for c in [*r.effects.custom_chunks, *_chunks(r)]]
            at += len(chunks)
            got = [_plain(c) for c in _chunks(res)]
            if got != want:
                problems.append(f"part {i + 1} came out as {got} where the plain streams give {want}")
                break
        if len(fused.results) != len(alone.results):
            problems.append(f"{len(fused.results)} results for {len(alone.results)} parts")
        if fused.end is None or alone.end is None or then.end is None:
            problems.append("a stream ended without StreamEnd")
        elif _plain(fused.end) != {
            "state": _plain(alone.end.state),
            "fused_states": [_plain(then.end.state)],
        }:
            problems.append(f"StreamEnd {_plain(fused.end)} does not carry both processors' states")
        self.report.check(name, problems, f"{len(fused.results)} parts as through the two streams in a row")

    def requests(
        self, batches: Sequence[Sequence[tpb.Chunk]], ctx: tpb.RunContext, *, start: int = 1
    ) -> list[ppb.ProcessOutputStreamRequest]:
        out = []
        seq = start
        for i, chunks in enumerate(batches):
            req = ppb.ProcessOutputStreamRequest()
            if i == 0:
                req.context.CopyFrom(ctx)
            for chunk in chunks:
                req.parts.add(seq=seq, part=chunk)
                seq += 1
            out.append(req)
        return out

    async def check_rewind(self, info: ppb.ProcessorInfo) -> None:
        """A speculative processor's stream after rewinds answers as if the withdrawn parts never came."""
        pid = info.id
        name = f"{pid} {STREAM}: rewinds restore the state"
        if not info.speculative:
            self.report.add("SKIP", name, "not speculative (the orchestrator never rewinds it)")
            return
        words = [text_delta(w if i == 0 else " " + w) for i, w in enumerate(PLAIN_TEXT.split(" ")[:4])]
        plain = await self.exchange(self.requests([words[:2], words[2:]], self.context(pid)))
        withdrawn = text_delta(" withdrawn")
        requests = self.requests([words[:2], [words[2], withdrawn]], self.context(pid))
        requests.append(
            ppb.ProcessOutputStreamRequest(rewind_to=4, parts=[ppb.StreamPart(seq=5, part=words[3])])
        )
        again = ppb.ProcessOutputStreamRequest(rewind_to=2)  # into the first batch
        for seq, chunk in zip(range(6, 9), words[1:], strict=True):
            again.parts.add(seq=seq, part=chunk)
        requests.append(again)
        rewound = await self.exchange(requests)
        problems = [
            f"{what} answered {e.code.name}: {e.details}"
            for what, e in (("plain stream", plain), ("rewound stream", rewound))
            if e.code != Code.OK
        ]
        if problems or any(r.effects.HasField("abort") for r in plain.results):
            self.report.check(name, problems, "aborted: compared no further")
            return
        expected = {5: plain.results[3], 6: plain.results[1], 7: plain.results[2], 8: plain.results[3]}
        by_seq = {r.seq: r for r in rewound.results}
        for seq, want in expected.items():
            got = by_seq.get(seq)
            if got is None:
                problems.append(f"no result for seq {seq}")
                continue
            same = ppb.StreamPartResult()
            same.CopyFrom(got)
            same.seq = want.seq
            if same != want:
                after = "rewind_to 4" if seq == 5 else "rewind_to 2"
                problems.append(
                    f"after {after}, seq {seq} answered {_plain(got)}; "
                    f"the same part without rewinds: {_plain(want)}"
                )
        if plain.end is not None and rewound.end is not None and plain.end.state != rewound.end.state:
            problems.append(f"the final state {_plain(rewound.end.state)} is not {_plain(plain.end.state)}")
        self.report.check(name, problems, "rewind_to 4 then 2: the same answers and final state as without")
