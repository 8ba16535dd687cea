"""How the checker talks to a sidecar: bounded unary calls, health, one stream exchange.

No call waits longer than the configured timeout plus a little slack, so a broken sidecar
cannot hang the checker.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from procmesh import convert
from procmesh._check.report import Report, Unreachable
from procmesh._check.requests import STATE_KEY
from procmesh._servicer import SERVICE_NAME
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb

Code = grpc.StatusCode


@dataclass
class StreamOutcome:
    """What one ProcessOutputStream exchange produced."""

    results: list[ppb.StreamPartResult] = field(default_factory=list)
    end: ppb.StreamEnd | None = None
    code: grpc.StatusCode | None = None
    details: str = ""
    problems: list[str] = field(default_factory=list)
    abort_at: int | None = None


class Wire:
    """The checker's side of the wire: requests, deadlines, health, stream exchanges (no checks)."""

    def __init__(
        self,
        address: str,
        report: Report,
        *,
        processor: str | None = None,
        options: dict[str, Any] | None = None,
        processor_options: Mapping[str, dict[str, Any]] | None = None,
        timeout: float = 5.0,
        wait: float = 10.0,
    ) -> None:
        self.address = address
        self.report = report
        self.only = processor
        self.options = convert.to_struct(options or {})
        """What every processor gets, unless `processor_options` names it."""
        self.processor_options = {pid: convert.to_struct(o) for pid, o in (processor_options or {}).items()}
        """Options by processor id: a sidecar's processors rarely share one options shape."""
        self.timeout = timeout
        self.wait = wait
        self.token = uuid.uuid4().hex[:12]
        self.stub: Any = None
        self.channel_: Any = None
        """The open channel, for requests sent as raw bytes."""
        self.health: Any = None
        self.aborts: dict[str, list[tuple[str, tpb.Abort]]] = {}

    # -- plumbing --------------------------------------------------------------------------------

    def sent_state(self) -> dict[str, Any]:
        return {STATE_KEY: {"token": self.token, "n": 1}}

    def context(self, processor_id: str, state: dict[str, Any] | None = None) -> tpb.RunContext:
        ctx = tpb.RunContext(
            processor_id=processor_id,
            run_id=f"check-{self.token}",
            agent_id="procmesh-check",
            step_number=0,
            retry_count=0,
            request_context=convert.to_struct({"checker": "procmesh check-sidecar"}),
        )
        ctx.options.CopyFrom(self.processor_options.get(processor_id, self.options))
        ctx.state.CopyFrom(convert.to_struct(self.sent_state() if state is None else state))
        return ctx

    async def unary(self, hook: str, request: Any, timeout: float | None = None) -> tuple[Any, Code, str]:
        """Call a unary RPC: (response or None, code, details); never waits past the deadline + slack."""
        limit = self.timeout if timeout is None else timeout
        try:
            resp = await asyncio.wait_for(getattr(self.stub, hook)(request, timeout=limit), limit + 2.0)
        except grpc.aio.AioRpcError as exc:
            return None, exc.code(), exc.details() or ""
        except TimeoutError:
            return None, Code.DEADLINE_EXCEEDED, "no answer (the client deadline did not fire either)"
        return resp, Code.OK, ""

    async def raw_call(self, rpc: str, payload: bytes, streaming: bool) -> tuple[Code, str]:
        """Send `payload` as the request of `rpc` without encoding it (one message on a stream)."""
        path = f"/{SERVICE_NAME}/{rpc}"
        try:
            if streaming:
                call = self.channel_.stream_stream(path)(iter([payload]), timeout=self.timeout)
                async for _ in call:
                    pass
            else:
                await asyncio.wait_for(
                    self.channel_.unary_unary(path)(payload, timeout=self.timeout), self.timeout + 2.0
                )
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        except TimeoutError:
            return Code.DEADLINE_EXCEEDED, "no answer (the client deadline did not fire either)"
        return Code.OK, ""

    async def health_status(self, service: str) -> str:
        try:
            resp = await asyncio.wait_for(
                self.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0), 3.0
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
        except TimeoutError:
            return "NO_ANSWER"
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))

    async def still_serving(self, name: str, probe: Callable[[], Any] | None = None) -> None:
        """Health SERVING (and `probe()` answering OK), else FAIL; an unreachable sidecar ends the run."""
        status = await self.health_status(SERVICE_NAME)
        problems = [] if status == "SERVING" else [f"health is {status}"]
        if not problems and probe is not None:
            _, code, details = await probe()
            if code != Code.OK:
                problems.append(f"a valid call then answered {code.name}: {details}")
        self.report.check(name, problems, "SERVING, and valid calls still answered" if probe else "SERVING")
        if status in ("UNAVAILABLE", "NO_ANSWER"):
            raise Unreachable(f"the sidecar at {self.address} stopped answering ({status})")

    # -- stream exchange ---------------------------------------------------------------------------

    async def stream(
        self,
        ctx: tpb.RunContext | None,
        batches: Sequence[Sequence[tpb.Chunk]],
        *,
        half_close: bool = True,
        deadline: float | None = None,
    ) -> StreamOutcome:
        """Send `batches` (seq from 1) and read every response.

        Each batch must be answered before the next one is sent (the orchestrator times each
        part from when it was sent, so a sidecar must not wait for the half-close).
        """
        wait = self.timeout
        out = StreamOutcome()
        call = self.stub.ProcessOutputStream(timeout=deadline if deadline is not None else wait + 1.0)

        async def read_one() -> ppb.ProcessOutputStreamResponse | None:
            resp = await asyncio.wait_for(call.read(), wait)
            if resp is grpc.aio.EOF:
                return None
            assert isinstance(resp, ppb.ProcessOutputStreamResponse)
            return resp

        def take(resp: ppb.ProcessOutputStreamResponse) -> None:
            for res in resp.results:
                if out.abort_at is not None:
                    out.problems.append(
                        f"a result (seq {res.seq}) came after the abort at seq {out.abort_at}"
                    )
                out.results.append(res)
                if res.effects.HasField("abort"):
                    out.abort_at = res.seq
            if resp.HasField("end"):
                if out.end is not None:
                    out.problems.append("two StreamEnd messages")
                out.end = resp.end

        seq = 0
        try:
            for i, batch in enumerate(batches):
                req = ppb.ProcessOutputStreamRequest()
                if i == 0 and ctx is not None:
                    req.context.CopyFrom(ctx)
                for chunk in batch:
                    seq += 1
                    req.parts.add(seq=seq, part=chunk)
                await call.write(req)
                # Every batch but the last is answered before the next one is sent, so an abort is
                # seen before writing on: a processor that ends its call right after aborting (the
                # contract asks it to wait for the half-close) would fail that write locally
                # (INTERNAL), losing what it sent.
                if i < len(batches) - 1:
                    try:
                        while len(out.results) < seq and out.abort_at is None and out.end is None:
                            resp = await read_one()
                            if resp is None:
                                break
                            take(resp)
                    except TimeoutError:
                        out.problems.append(
                            f"batch {i + 1} ({seq} parts sent) got no answer within {wait:g}s: answer "
                            "parts as they come, not after the half-close"
                        )
                        call.cancel()
                        out.code, out.details = Code.CANCELLED, "cancelled by the checker"
                        return out
                if out.abort_at is not None or out.end is not None:
                    break
            if half_close:  # after an abort too: the processor ends its call on the half-close
                await call.done_writing()
            while True:
                resp = await read_one()
                if resp is None:
                    break
                take(resp)
            out.code = await asyncio.wait_for(call.code(), wait)
            out.details = await asyncio.wait_for(call.details(), wait) or ""
        except grpc.aio.AioRpcError as exc:
            out.code, out.details = exc.code(), exc.details() or ""
        except TimeoutError:
            out.code, out.details = Code.DEADLINE_EXCEEDED, f"no answer within {wait:g}s"
            call.cancel()
        except (grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
            out.code, out.details = Code.UNKNOWN, f"stream broke: {exc}"
            call.cancel()
        return out
