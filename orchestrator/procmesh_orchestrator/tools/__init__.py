"""Agents' tools bound to what runs them: fixed results, tools sidecars host, MCP servers' tools.

`catalog.ToolCatalog` binds the configured tools at start-up (the sidecars' Describe answers, the
MCP servers' tool lists); `mcp` is the Model Context Protocol client, imported only when an MCP
server is in use (the MCP SDK pulls in a web stack).
"""

from procmesh_orchestrator.tools.catalog import McpServerTool, ToolCatalog

__all__ = ["McpServerTool", "ToolCatalog"]
