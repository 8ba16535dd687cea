"""Agents' tools bound to what runs them: fixed results, tools sidecars host, MCP servers' tools.

`ToolCatalog` is built at start-up from the config, the sidecars' Describe answers and the MCP
servers' tool lists; every problem is a `ConfigError` naming the key. A sidecar's tool is called
over ExecuteTool, the same path as a tool a processor adds to a step (`run.tools.ProcessorTool`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any

import jsonschema
from google.protobuf import struct_pb2

from procmesh import convert
from procmesh_orchestrator.config import Config, ToolConfig
from procmesh_orchestrator.config.agents import AgentConfig
from procmesh_orchestrator.errors import ConfigError, McpError, ProcessorFailedError
from procmesh_orchestrator.processors.catalog import SidecarCatalog
from procmesh_orchestrator.processors.lanes import ProcessorHandle
from procmesh_orchestrator.run import context
from procmesh_orchestrator.run.background import BackgroundOptions, BackgroundTool
from procmesh_orchestrator.run.tools import ProcessorTool, StaticTool, Tool, ToolCall, ToolOutcome, Writer

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore
    from procmesh_orchestrator.tools import mcp

log = logging.getLogger(__name__)


def _meta(run: RunCore) -> dict[str, Any] | None:
    """A call's ``_meta``: the run's request context (its JSON entries), hooks' values included."""
    values = context.serializable(run.info.request_context)
    return {context.MCP_META_KEY: values} if values else None


class McpServerTool:
    """A tool of an MCP server, called over the server's session; a failure follows `on_failure`."""

    def __init__(
        self, name: str, listed: mcp.McpTool, connection: mcp.McpConnection, config: ToolConfig | None
    ) -> None:
        self.name = name
        self.remote = listed.name
        self.description = (config.description if config else "") or listed.description
        self.input_schema = (config.input_schema if config else {}) or listed.input_schema
        self.requires_approval = bool(config and config.require_approval)
        self.timeout = config.timeout if config else None
        self.on_failure = (config.on_failure if config else None) or "fail-closed"
        self.connection = connection

    async def execute(self, run: RunCore, call: ToolCall, writer: Writer) -> ToolOutcome:
        """Call the server: an isError answer is the tool's error, a failed call the policy's."""
        timeout = self.timeout
        if run.info.deadline is not None:
            left = max(0.001, run.info.deadline - time.monotonic())
            timeout = min(timeout, left) if timeout else left
        args = call.args if isinstance(call.args, dict) else {}

        async def report(progress: float, total: float | None, message: str | None) -> None:
            """A progress notification: a ``data-tool-progress`` chunk (the MCP form of a tool's
            writer.custom(); log messages are session-wide, so they are not the call's chunks)."""
            data: dict[str, Any] = {"toolCallId": call.call_id, "toolName": self.name, "progress": progress}
            if total is not None:
                data["total"] = total
            if message:
                data["message"] = message
            await writer({"type": "data-tool-progress", "data": data})

        try:
            answer = await self.connection.call_tool(self.remote, args, timeout, _meta(run), report)
        except McpError as exc:
            if self.on_failure == "fail-open":
                log.warning("MCP tool %s failed; the model is told (fail-open): %s", self.name, exc)
                return ToolOutcome(error=f"tool {self.name!r} is unavailable: {exc}")
            raise ProcessorFailedError(f"mcp:{self.connection.config.name}", "tools/call", str(exc)) from exc
        if answer.is_error:
            content = answer.content
            return ToolOutcome(
                error=content if isinstance(content, str) else json.dumps(content, default=str)
            )
        return ToolOutcome(answer.content)


class ToolCatalog:
    """Every configured tool, bound: `start()` connects the MCP servers agents use."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.connections: dict[str, mcp.McpConnection] = {}
        self._listed: dict[str, dict[str, mcp.McpTool]] = {}
        self._tools: dict[str, Tool] = {}

    def _used_servers(self) -> set[str]:
        named = {t.mcp for t in self.config.tools.values() if t.mcp}
        return named | {s for a in self.config.agents.values() for s in a.mcp_servers}

    async def start(self, sidecars: SidecarCatalog) -> None:
        """Connect the MCP servers in use, list their tools, and bind every configured tool (a
        sidecar's from what its Describe lists)."""
        servers = sorted(self._used_servers())
        if servers:  # the MCP SDK pulls in a web stack: imported only when a server is in use
            from procmesh_orchestrator.tools import mcp
        for name in servers:
            server = self.config.mcp_servers[name]
            connection = mcp.McpConnection(
                mcp.McpServerConfig(
                    name=name,
                    command=server.command,
                    env=dict(server.env),
                    cwd=server.cwd,
                    url=server.url,
                    headers=dict(server.headers),
                    timeout=server.timeout,
                )
            )
            self.connections[name] = connection  # closed by close() even when start fails half-way
            try:
                await connection.start()
                self._listed[name] = {t.name: t for t in await connection.list_tools()}
            except McpError as exc:
                raise ConfigError(f"mcpServers.{name}: {exc}") from exc
        for name, cfg in self.config.tools.items():
            self._tools[name] = self._bind(name, cfg, sidecars)

    def _bind(
        self,
        name: str,
        cfg: ToolConfig,
        sidecars: SidecarCatalog,
    ) -> Tool:
        where = f"tools.{name}"
        remote = cfg.tool or name
        tool: Tool
        if cfg.sidecar:
            hosted = sidecars.tools
            info = hosted.get(cfg.sidecar, {}).get(remote)
            if info is None:
                raise ConfigError(
                    f"{where}: sidecar {cfg.sidecar!r} does not host tool {remote!r} "
                    f"(it hosts {sorted(hosted.get(cfg.sidecar, {}))})"
                )
            sidecar = sidecars.sidecars[cfg.sidecar]
            host = ProcessorHandle(
                key=f"tool:{cfg.sidecar}/{remote}",
                processor_id=f"tool:{name}",
                client=sidecars.clients[cfg.sidecar],
                options=struct_pb2.Struct(),
                hooks=frozenset({"execute_tool"}),
                process_data_parts=False,
                timeout=cfg.timeout or sidecar.timeout,
                on_failure=cfg.on_failure or sidecar.on_failure,
                tool_host=True,
                sidecar=cfg.sidecar,
            )
            tool = ProcessorTool(
                name,
                cfg.description or info.description,
                cfg.input_schema or convert.from_struct(info.input_schema) or {"type": "object"},
                host,
                hosted_name=remote,
                requires_approval=cfg.require_approval,
            )
        elif cfg.mcp:
            listed = self._listed[cfg.mcp].get(remote)
            if listed is None:
                raise ConfigError(
                    f"{where}: MCP server {cfg.mcp!r} has no tool {remote!r} "
                    f"(it has {sorted(self._listed[cfg.mcp])})"
                )
            tool = McpServerTool(name, listed, self.connections[cfg.mcp], cfg)
        else:
            tool = StaticTool(
                name, cfg.description, cfg.input_schema, cfg.result, cfg.custom, cfg.require_approval
            )
        _check_schema(tool.input_schema, f"{where}.inputSchema")
        if cfg.background is not None:
            tool = BackgroundTool(tool, BackgroundOptions(**cfg.background.model_dump()))
        return tool

    def for_agent(self, agent_id: str, agent: AgentConfig) -> dict[str, Tool]:
        """The agent's tools by name: its `tools`, then every tool of its `mcpServers`."""
        tools = {name: self._tools[name] for name in agent.tools}
        for server in agent.mcp_servers:
            for listed in self._listed[server].values():
                if listed.name in tools:
                    raise ConfigError(
                        f"agents.{agent_id}.mcpServers: MCP server {server!r} has a tool named "
                        f"{listed.name!r}, which the agent already has"
                    )
                tools[listed.name] = McpServerTool(listed.name, listed, self.connections[server], None)
        return tools

    async def close(self) -> None:
        """Close every MCP session (stdio servers are stopped)."""
        await asyncio.gather(*(c.close() for c in self.connections.values()), return_exceptions=True)


def _check_schema(schema: dict[str, Any], where: str) -> None:
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"{where}: not a valid JSON schema: {exc.message}") from None
