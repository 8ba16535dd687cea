"""A client for Model Context Protocol servers, whose tools an agent can take.

One `McpConnection` per configured server, over stdio (this process starts the server) or
streamable HTTP, through the official `mcp` SDK. The SDK's transports and session are anyio
context managers whose task groups must be entered and exited by one task, so each connection
runs them in a long-lived background task (the *host*) and callers talk to the session it holds:
requests from many tasks share it, and a caller that is cancelled cancels its request (the SDK
sends ``notifications/cancelled``) without touching the session.

When the server dies (the stdio process exits, the HTTP transport fails) the host ends; the next
call starts a new one once (stdio: a new process) and fails with `McpError` if that fails too. A
call that was in flight when the connection broke is not resent: the tool may have run.
"""

from procmesh_orchestrator.tools.mcp._connection import McpConnection
from procmesh_orchestrator.tools.mcp._types import McpResult, McpServerConfig, McpTool

__all__ = ["McpConnection", "McpResult", "McpServerConfig", "McpTool"]
