"""The checks of one processor: its declared hooks, the stream, state, undeclared hooks, deadlines, aborts."""

from __future__ import annotations

import time
from typing import Any

from procmesh import convert
from procmesh._check.fusion import FusionChecks, _plain
from procmesh._check.problems import abort_problems, effects_problems, response_problems
from procmesh._check.requests import (
    HOOKS,
    PLAIN_TEXT,
    PROBE_TEXT,
    STATE_KEY,
    STREAM,
    build_request,
    text_delta,
)
from procmesh._check.wire import Code
from procmesh.v1 import processor_pb2 as ppb


def _state(struct: Any) -> dict[str, Any]:
    return convert.from_struct(struct)


class ProcessorChecks(FusionChecks):
    """Checks one processor at a time; `SidecarChecker` adds the sidecar-wide checks around them."""

    async def check_processor(self, info: ppb.ProcessorInfo) -> None:
        pid = info.id
        declared = [HOOKS[h] for h in info.hooks]
        states: list[tuple[str, dict[str, Any] | None]] = []
        for hook in declared:
            if hook == STREAM:
                await self.check_stream(info, states)
                await self.check_unchanged(info)
                await self.check_rewind(info)
                continue
            problems: list[str] = []
            calls = 0
            for text in (PLAIN_TEXT, PROBE_TEXT):
                resp, code, details = await self.unary(hook, build_request(hook, self.context(pid), text))
                calls += 1
                if code != Code.OK:
                    problems.append(
                        f"{'probe' if text is PROBE_TEXT else 'plain'} request: {code.name}: {details}"
                    )
                    continue
                problems += response_problems(hook, resp)
                if resp.effects.HasField("abort"):
                    self.aborts.setdefault(pid, []).append((hook, resp.effects.abort))
                if text is PLAIN_TEXT:
                    states.append(
                        (hook, _state(resp.effects.state) if resp.effects.HasField("state") else None)
                    )
            self.report.check(
                f"{pid} {hook}: valid requests", problems, f"{calls} calls answered OK, well-formed"
            )
        await self.check_state(info, states)
        await self.check_undeclared(info)
        await self.check_deadline(info)
        self.check_aborts(pid)

    async def check_stream(
        self, info: ppb.ProcessorInfo, states: list[tuple[str, dict[str, Any] | None]]
    ) -> None:
        pid = info.id
        data = convert.chunk_to_proto({"type": "data-procmesh-check", "data": {"n": 1}})
        words = PLAIN_TEXT.split(" ")
        batches = [
            [text_delta(w if i == 0 else " " + w) for i, w in enumerate(words[:3])],
            [text_delta(" " + words[3]), data, text_delta(" " + words[4])],
            [text_delta(" " + w) for w in words[5:]],
        ]
        sent = [part for batch in batches for part in batch]
        outcome = await self.stream(self.context(pid), batches)
        problems = list(outcome.problems)
        if outcome.code != Code.OK:
            problems.append(
                f"the stream ended with {outcome.code.name if outcome.code else '?'}: {outcome.details}"
            )
        answered = outcome.results
        limit = len(sent) if outcome.abort_at is None else outcome.abort_at
        for i, res in enumerate(answered[:limit]):
            if res.seq != i + 1:
                problems.append(
                    f"result {i + 1} carries seq {res.seq} (results must come in order, seq echoed)"
                )
                break
            problems += effects_problems(res.effects)
            if res.HasField("part") and not res.part.type:
                problems.append(f"the result for seq {res.seq} has a chunk without type")
            if sent[i].type.startswith("data-") and not info.process_data_parts and res.part != sent[i]:
                problems.append(f"the data-* part (seq {res.seq}) was not passed through untouched")
        if outcome.abort_at is None and len(answered) != len(sent):
            problems.append(f"{len(answered)} results for {len(sent)} parts")
        for res in answered:
            if res.effects.HasField("abort"):
                self.aborts.setdefault(pid, []).append((STREAM, res.effects.abort))
        dropped = sum(1 for r in answered if not r.HasField("part") and not r.effects.HasField("abort"))
        self.report.check(
            f"{pid} {STREAM}: batches answered in order",
            problems,
            f"{len(sent)} parts in 3 batches, {len(answered)} results in order"
            + (f" ({dropped} dropped)" if dropped else "")
            + (f", aborted at seq {outcome.abort_at}" if outcome.abort_at else ""),
        )
        end_problems = []
        if outcome.end is None:
            end_problems.append(
                "no StreamEnd" + (" after the abort" if outcome.abort_at else " after the half-close")
            )
        elif not outcome.end.HasField("state"):
            end_problems.append("StreamEnd carries no state")
        if outcome.code != Code.OK:
            end_problems.append(f"status {outcome.code.name if outcome.code else '?'}, not OK")
        self.report.check(f"{pid} {STREAM}: StreamEnd", end_problems, "StreamEnd{state} then OK")
        state = (
            _state(outcome.end.state) if outcome.end is not None and outcome.end.HasField("state") else None
        )
        states.insert(0, (STREAM, state))
        probe = await self.stream(self.context(pid), [[text_delta(PROBE_TEXT)]])
        for res in probe.results:
            if res.effects.HasField("abort"):
                self.aborts.setdefault(pid, []).append((STREAM, res.effects.abort))
        probe_problems = list(probe.problems)
        if probe.code != Code.OK:
            probe_problems.append(
                f"the stream ended with {probe.code.name if probe.code else '?'}: {probe.details}"
            )
        if probe.abort_at is None and len(probe.results) != 1:
            probe_problems.append(f"{len(probe.results)} results for 1 part")
        if probe.end is None:
            probe_problems.append("no StreamEnd")
        self.report.check(f"{pid} {STREAM}: probe part", probe_problems, "answered, StreamEnd, OK")

    async def check_unchanged(self, info: ppb.ProcessorInfo) -> None:
        """Each part the stream answers in an unchanged run (``unchanged_through``, when the first
        request sets ``unchanged_results``) is one the same stream without the flag gives back as
        it came, with no effects: otherwise the orchestrator passes on a part the processor
        changed (a redaction that claims "unchanged" lets the text through)."""
        pid = info.id
        name = f"{pid} {STREAM}: unchanged runs"
        words = PLAIN_TEXT.split(" ")
        data = convert.chunk_to_proto({"type": "data-procmesh-check", "data": {"n": 1}})
        batches = [[text_delta(w if i == 0 else " " + w) for i, w in enumerate(words[:4])], [data]]
        batches.append([text_delta(" " + w) for w in words[4:]])
        sent = {i + 1: part for i, part in enumerate(p for batch in batches for p in batch)}
        plain = await self.exchange(self.requests(batches, self.context(pid)))
        requests = self.requests(batches, self.context(pid))
        requests[0].unchanged_results = True
        runs = await self.exchange(requests)
        problems = [
            f"{what} answered {e.code.name}: {e.details}"
            for what, e in (("plain stream", plain), ("stream with unchanged_results", runs))
            if e.code != Code.OK
        ]
        if problems or any(r.effects.HasField("abort") for r in plain.results + runs.results):
            self.report.check(name, problems, "aborted: compared no further")
            return
        answers = {r.seq: r for r in plain.results if not r.more}
        covered = 0
        for res in runs.results:
            if not res.unchanged_through:
                continue
            first, last = res.seq, res.unchanged_through
            if (
                last < first
                or last not in sent
                or res.more
                or res.HasField("part")
                or res.HasField("effects")
                or res.extra_parts
            ):
                problems.append(
                    f"the run {first} to {last} is malformed "
                    "(beyond the parts sent, or carrying a part, effects or more)"
                )
                continue
            for seq in range(first, last + 1):
                covered += 1
                want = answers.get(seq)
                if want is None:
                    problems.append(
                        f"seq {seq} is in an unchanged run, but without the flag it has no result"
                    )
                elif want.part != sent[seq] or want.extra_parts or want.effects.ListFields():
                    shown = _plain(want)
                    problems.append(
                        f"seq {seq} is in an unchanged run, but without the flag it is answered {shown}"
                    )
        detail = (
            f"{covered} of {len(sent)} parts in unchanged runs, each given back unchanged without the flag"
        )
        self.report.check(
            name, problems, detail if covered else "no unchanged runs (every part answered in full)"
        )

    async def check_state(
        self, info: ppb.ProcessorInfo, states: list[tuple[str, dict[str, Any] | None]]
    ) -> None:
        pid = info.id
        name = f"{pid}: state round-trip"
        sent = self.sent_state()
        problems = []
        for hook, state in states:
            if state is not None and state.get(STATE_KEY) != sent[STATE_KEY]:
                problems.append(
                    f"{hook} returned a state without the keys it was sent (return the whole state)"
                )
        returned = [(hook, s) for hook, s in states if s is not None]
        if problems or not returned:
            self.report.check(
                name, problems, "no hook returns a state (the orchestrator keeps the stored one)"
            )
            return
        # The state a call returned is what the next call gets: it must be built on, not dropped.
        hook, first = returned[0]
        second: dict[str, Any] | None
        if hook == STREAM:
            outcome = await self.stream(self.context(pid, first), [[text_delta(PLAIN_TEXT)]])
            second = (
                _state(outcome.end.state)
                if outcome.end is not None and outcome.end.HasField("state")
                else None
            )
            if outcome.code != Code.OK:
                problems.append(
                    f"the second {STREAM} ended with {outcome.code.name if outcome.code else '?'}"
                )
        else:
            resp, code, details = await self.unary(
                hook, build_request(hook, self.context(pid, first), PLAIN_TEXT)
            )
            second = (
                _state(resp.effects.state) if resp is not None and resp.effects.HasField("state") else None
            )
            if code != Code.OK:
                problems.append(f"the second {hook} answered {code.name}: {details}")
        if second is None:
            problems.append(f"{hook} returned no state when sent the state it returned before")
        else:
            lost = sorted(set(first) - set(second))
            if lost:
                problems.append(f"{hook} dropped keys {lost} of the state it was sent")
        touched = sorted(set(first) - {STATE_KEY})
        self.report.check(
            name,
            problems,
            f"{len(returned)} hook(s) return the whole state; {hook} builds on its previous state"
            + (f" (keys {touched})" if touched else ""),
        )

    async def check_undeclared(self, info: ppb.ProcessorInfo) -> None:
        pid = info.id
        declared = {HOOKS[h] for h in info.hooks}
        problems = []
        checked = []
        for hook in HOOKS.values():
            if hook in declared:
                continue
            checked.append(hook)
            if hook == STREAM:
                outcome = await self.stream(self.context(pid), [[text_delta(PLAIN_TEXT)]])
                code, details = outcome.code or Code.OK, outcome.details
            else:
                _, code, details = await self.unary(hook, build_request(hook, self.context(pid), PLAIN_TEXT))
            if code != Code.UNIMPLEMENTED:
                problems.append(f"{hook} answered {code.name}{': ' + details if details else ''}")
        if not checked:
            self.report.add("SKIP", f"{pid}: undeclared hooks", "every hook is declared")
            return
        self.report.check(f"{pid}: undeclared hooks answer UNIMPLEMENTED", problems, f"{len(checked)} hooks")

    async def check_deadline(self, info: ppb.ProcessorInfo) -> None:
        pid = info.id
        hook = HOOKS[info.hooks[0]]
        tiny = 0.005
        started = time.monotonic()
        if hook == STREAM:
            outcome = await self.stream(
                self.context(pid), [[text_delta(PLAIN_TEXT)]], half_close=False, deadline=0.3
            )
            code, details = outcome.code or Code.UNKNOWN, outcome.details
            allowed = {Code.DEADLINE_EXCEEDED, Code.CANCELLED}
            what = "a stream left open past its 0.3s deadline"
            if outcome.abort_at is not None:
                # The part made the processor abort: it sends StreamEnd at once and, as the
                # contract asks, waits for a half-close that never comes (the deadline ends it);
                # one that ends its call right away (OK) is tolerated.
                allowed.add(Code.OK)
                what += f" (aborted at seq {outcome.abort_at})"
            budget = 0.3 + 2.0
        else:
            _, code, details = await self.unary(
                hook, build_request(hook, self.context(pid), PLAIN_TEXT), timeout=tiny
            )
            allowed = {Code.DEADLINE_EXCEEDED, Code.OK}
            what = f"a {hook} call with a {tiny * 1000:g}ms deadline"
            budget = 1.0
        elapsed = time.monotonic() - started
        problems = []
        if code not in allowed:
            problems.append(f"{what} answered {code.name}: {details}")
        if elapsed > budget:
            problems.append(f"{what} took {elapsed:.2f}s")
        self.report.check(
            f"{pid}: deadline respected", problems, f"{what}: {code.name} after {elapsed * 1000:.0f}ms"
        )

        async def probe() -> tuple[Any, Code, str]:
            if hook == STREAM:
                out = await self.stream(self.context(pid), [[text_delta(PLAIN_TEXT)]])
                return None, out.code or Code.UNKNOWN, out.details
            return await self.unary(hook, build_request(hook, self.context(pid), PLAIN_TEXT))

        await self.still_serving(f"{pid}: still SERVING after the deadline", probe)

    def check_aborts(self, pid: str) -> None:
        seen = self.aborts.get(pid, [])
        name = f"{pid}: abort/retry encoding"
        if not seen:
            self.report.add("SKIP", name, "no request made this processor abort")
            return
        problems: list[str] = []
        descriptions = []
        for hook, abort in seen:
            found, desc = abort_problems(hook, abort)
            problems += found
            descriptions.append(desc)
        self.report.check(name, problems, " | ".join(dict.fromkeys(descriptions)))
