"""The sidecar-wide checks (health, Describe, hosted tools, malformed requests) and every processor's."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import grpc
from grpc_health.v1 import health_pb2_grpc

from procmesh._check.problems import new_kind_problems
from procmesh._check.processor import ProcessorChecks
from procmesh._check.report import Report, Unreachable
from procmesh._check.requests import (
    CORRUPT_BYTES,
    HOOKS,
    PLAIN_TEXT,
    STREAM,
    UNKNOWN_PROCESSOR,
    UNKNOWN_TOOL,
    WITH_MESSAGES,
    build_request,
    text_delta,
)
from procmesh._check.wire import Code
from procmesh._servicer import SERVICE_NAME
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import processor_pb2_grpc as pgrpc
from procmesh.v1 import types_pb2 as tpb


class SidecarChecker(ProcessorChecks):
    """Runs every check against one sidecar address and fills a `Report`."""

    credentials: grpc.ChannelCredentials | None = None
    """TLS (and mTLS) to the sidecar; plaintext when None."""
    server_name: str | None = None
    """The name to verify in the sidecar's certificate (default: the address's host)."""
    tools: Sequence[ppb.HostedTool] = ()
    """The standalone tools Describe listed."""
    fuses = False
    """Describe says the sidecar runs fused requests."""

    def channel(self) -> grpc.aio.Channel:
        if self.credentials is None:
            return grpc.aio.insecure_channel(self.address)
        options = [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
        return grpc.aio.secure_channel(self.address, self.credentials, options=options)

    async def run(self) -> None:
        async with self.channel() as channel:
            self.channel_ = channel
            self.stub = pgrpc.ProcessorServiceStub(channel)
            self.health = health_pb2_grpc.HealthStub(channel)
            try:
                if not await self.check_health():
                    return
                described = await self.check_describe()
                if not described and not self.tools:
                    return
                await self.check_malformed(described)
                for info in described:
                    await self.check_processor(info)
                if described and self.fuses:
                    await self.check_fused(described)
                elif described:
                    self.report.add("SKIP", "fused requests", "Describe does not say fuses")
                await self.still_serving("sidecar still SERVING at the end")
            except Unreachable as exc:
                self.report.add("FAIL", "sidecar reachable", f"{exc}; the remaining checks did not run")

    async def check_health(self) -> bool:
        deadline = time.monotonic() + self.wait
        status = await self.health_status(SERVICE_NAME)
        while status != "SERVING" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            status = await self.health_status(SERVICE_NAME)
        server = await self.health_status("")
        problems = []
        if status != "SERVING":
            problems.append(f"{SERVICE_NAME!r} is {status} after {self.wait:g}s")
        if server != "SERVING":
            problems.append(f"'' (the server) is {server}")
        self.report.check("health", problems, f"SERVING for '' and {SERVICE_NAME!r}")
        # Without a health service (or while NOT_SERVING) the other checks still say something.
        return status not in ("UNAVAILABLE", "NO_ANSWER")

    async def check_describe(self) -> list[ppb.ProcessorInfo]:
        resp, code, details = await self.unary("Describe", ppb.DescribeRequest())
        if code != Code.OK:
            self.report.add("FAIL", "Describe", f"{code.name}: {details}")
            return []
        problems: list[str] = []
        seen: set[str] = set()
        for info in resp.processors:
            if not info.id:
                problems.append("a processor has an empty id")
            elif "/" in info.id or info.id != info.id.strip():
                problems.append(f"id {info.id!r} cannot be referenced as 'sidecar/id'")
            if info.id in seen:
                problems.append(f"id {info.id!r} is listed twice")
            seen.add(info.id)
            hooks = list(info.hooks)
            if not hooks:
                problems.append(f"{info.id!r} declares no hook")
            for hook in hooks:
                if hook not in HOOKS:
                    problems.append(f"{info.id!r} declares an unknown hook value {hook}")
            if len(set(hooks)) != len(hooks):
                problems.append(f"{info.id!r} lists a hook twice")
            if info.options_schema_json:
                try:
                    schema = json.loads(info.options_schema_json)
                except ValueError as exc:
                    problems.append(f"{info.id!r} options_schema_json is not JSON: {exc}")
                else:
                    if not isinstance(schema, dict):
                        problems.append(f"{info.id!r} options_schema_json is not a JSON object")
        if not resp.processors and not resp.tools:
            problems.append("no processor and no tool is hosted")
        listed = [
            f"{i.id} [{', '.join(HOOKS.get(h, str(h)) for h in i.hooks)}]"
            + (" +data parts" if i.process_data_parts else "")
            + (" +speculative" if i.speculative else "")
            for i in resp.processors
        ]
        fuses = "; fuses" if resp.fuses else ""
        self.report.check(
            "Describe", problems, f"sdk {resp.sdk or '(not given)'}{fuses}; " + "; ".join(listed)
        )
        self.fuses = resp.fuses
        if problems:
            return []
        if resp.tools:
            self.tools = list(resp.tools)
            self.report.check(
                "hosted tools", tool_problems(resp.tools), ", ".join(t.name for t in resp.tools)
            )
        if not resp.processors:
            return []
        selected = [i for i in resp.processors if self.only in (None, i.id)]
        if not selected:
            self.report.add(
                "FAIL", "--processor", f"{self.only!r} is not hosted here (hosted: {sorted(seen)})"
            )
        for pid in sorted(set(self.processor_options) - seen):
            # Options meant for a processor that is not there: a typo would silently test defaults.
            self.report.add("FAIL", "--options", f"{pid!r} is not hosted here (hosted: {sorted(seen)})")
        return selected

    async def check_malformed(self, described: Sequence[ppb.ProcessorInfo]) -> None:
        owner: dict[str, str] = {}
        for info in described:
            for value in info.hooks:
                owner.setdefault(HOOKS[value], info.id)
        if self.tools:
            owner.setdefault(TOOL_RPC, "")
        for hook in HOOKS.values():
            if hook not in owner:
                continue
            cases: list[tuple[str, tpb.RunContext, bool, Code]] = [
                ("empty processor_id", self.context(""), False, Code.INVALID_ARGUMENT),
                ("unknown processor", self.context(UNKNOWN_PROCESSOR), False, Code.NOT_FOUND),
            ]
            if hook == TOOL_RPC:  # an empty processor_id names a hosted tool: an unknown one
                cases[0] = ("unknown hosted tool", self.context(""), False, Code.NOT_FOUND)
            if hook in WITH_MESSAGES and owner[hook]:
                cases.append((NEW_KIND, self.context(owner[hook]), True, Code.OK))
            for what, ctx, new_kind, want in cases:
                resp = None
                if hook == STREAM:
                    outcome = await self.stream(ctx, [[text_delta(PLAIN_TEXT)]])
                    code, details = outcome.code or Code.OK, outcome.details
                else:
                    req = build_request(hook, ctx, PLAIN_TEXT, new_kind=new_kind)
                    if hook == TOOL_RPC and not ctx.processor_id:
                        req.tool_name = UNKNOWN_TOOL
                    resp, code, details = await self.unary(hook, req)
                name = f"malformed {hook}: {what}"
                if code == want == Code.OK:
                    self.report.check(name, new_kind_problems(resp), "OK, passed through untouched")
                elif code == want:
                    self.report.check(name, [] if details else ["no details"], f"{code.name}: {details}")
                else:
                    self.report.add("FAIL", name, _unexpected(want.name, code, details, new_kind))
            # Bytes no parser reads: what stock generated servers answer (INTERNAL) passes too.
            code, details = await self.raw_call(hook, CORRUPT_BYTES, hook == STREAM)
            name = f"malformed {hook}: corrupt bytes"
            if code in (Code.INVALID_ARGUMENT, Code.INTERNAL):
                self.report.check(name, [], f"{code.name}: {details}")
            else:
                self.report.add(
                    "FAIL", name, _unexpected("INVALID_ARGUMENT or INTERNAL", code, details, False)
                )
        if not described:
            await self.still_serving("still SERVING after malformed requests")
            return
        first = described[0]
        first_hook = HOOKS[first.hooks[0]]

        async def probe() -> tuple[Any, Code, str]:
            if first_hook == STREAM:
                outcome = await self.stream(self.context(first.id), [[text_delta(PLAIN_TEXT)]])
                return None, outcome.code or Code.UNKNOWN, outcome.details
            return await self.unary(first_hook, build_request(first_hook, self.context(first.id), PLAIN_TEXT))

        await self.still_serving("still SERVING after malformed requests", probe)


TOOL_RPC = "ExecuteTool"
NEW_KIND = "message part of an unknown kind"


def _unexpected(want: str, code: Code, details: str, new_kind: bool) -> str:
    """Why a malformed request's answer fails its check."""
    if new_kind:
        want += " (a part of a kind unknown here is a newer orchestrator's: pass it on, never refuse it)"
    crash = " (looks like a crash)" if code in (Code.UNKNOWN, Code.INTERNAL, Code.UNAVAILABLE) else ""
    said = f": {details}" if details else ""
    return f"expected {want}, got {code.name}{crash}{said}"


def tool_problems(tools: Sequence[ppb.HostedTool]) -> list[str]:
    """What is wrong with Describe's hosted tools: empty or duplicate names, a non-object schema."""
    problems: list[str] = []
    seen: set[str] = set()
    for tool in tools:
        if not tool.name:
            problems.append("a hosted tool has an empty name")
        elif tool.name in seen:
            problems.append(f"tool {tool.name!r} is listed twice")
        seen.add(tool.name)
        kind = tool.input_schema.fields.get("type")
        if kind is None or kind.string_value != "object":
            problems.append(
                f"tool {tool.name!r}: input_schema is not an object schema ({{'type': 'object'}})"
            )
    return problems


async def check(
    address: str,
    *,
    processor: str | None = None,
    options: dict[str, Any] | None = None,
    processor_options: Mapping[str, dict[str, Any]] | None = None,
    timeout: float = 5.0,
    wait: float = 10.0,
    credentials: grpc.ChannelCredentials | None = None,
    server_name: str | None = None,
    out: TextIO = sys.stdout,
) -> Report:
    """Run every check against the sidecar at `address`; the report's lines are printed to `out`.

    `options` go to every processor that `processor_options` (options by processor id) does not name.
    With `credentials` the checker connects over TLS, verifying `server_name` when given.
    """
    report = Report(out)
    checker = SidecarChecker(
        address,
        report,
        processor=processor,
        options=options,
        processor_options=processor_options,
        timeout=timeout,
        wait=wait,
    )
    checker.credentials = credentials
    checker.server_name = server_name
    await checker.run()
    out.write(report.summary() + "\n")
    return report
