"""``@mastra/client-js``'s MCP-server API over the MCP servers of the configuration (``mcpServers``):
listed and described in the reference's registry shapes, with the tools the agents take from each.
procmesh is a client of those servers, serving none itself, so what only a server it hosts could
answer (its transport, its resources, executing a tool outside a run) is a 501 naming why."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from procmesh_orchestrator.service._errors import BadRequestError, CatalogNotFoundError, NotSupportedError
from procmesh_orchestrator.service.api.catalog import all_tools
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.http.bodies import json_response, query_int, route
from procmesh_orchestrator.store import label
from procmesh_orchestrator.tools.catalog import McpServerTool

_PAGING = ("page", "perPage", "limit", "offset")

SERVED_BY_NONE = (
    "procmesh is a client of the configured MCP servers and hosts none: their tools run inside "
    "agent runs (or through /api/tools/{toolId}/execute)"
)


class McpRoutes:
    """``/api/mcp/...``: the configured MCP servers and the tools agents take from them."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core

    def routes(self) -> list[Route]:
        return [
            route("/api/mcp/v0/servers", self.list_servers, "GET", *_PAGING),
            route("/api/mcp/v0/servers/{server_id}", self.get_server, "GET"),
            route("/api/mcp/{server_id}/tools", self.list_tools, "GET"),
            route("/api/mcp/{server_id}/tools/{tool_id}", self.get_tool, "GET", "requestContext"),
            *(
                Route(f"/api/mcp/{{server_id}}/{path}", self.not_hosted, methods=[method])
                for method, path in (
                    ("POST", "tools/{tool_id}/execute"),
                    ("GET", "resources"),
                    ("POST", "resources/read"),
                    ("POST", "messages"),
                )
            ),
        ]

    def _server(self, request: Request) -> str:
        server_id = request.path_params["server_id"]
        if server_id not in self.core.app.config.mcp_servers:
            configured = sorted(self.core.app.config.mcp_servers)
            raise CatalogNotFoundError(f"no MCP server {label(server_id)} (configured: {configured})")
        return str(server_id)

    async def list_servers(self, request: Request) -> Response:
        """``getMcpServers({page, perPage})`` (or the older ``{offset, limit}``): one page of the
        configured servers, by name, and ``next``, the next page's URL in the form asked (null on
        the last page). Both forms of one setting at once is a 400 naming them: one would be
        ignored."""
        query = request.query_params
        for new, old in (("perPage", "limit"), ("page", "offset")):
            if query.get(new) is not None and query.get(old) is not None:
                raise BadRequestError(f"{new} and {old}: give one ({old} is the older name of {new})")
        legacy = query.get("offset") is not None or query.get("limit") is not None
        per_page = query_int(query.get("perPage", query.get("limit")), "perPage", 100, 1)
        if query.get("offset") is not None:
            start = query_int(query.get("offset"), "offset", 0, 0)
        else:
            start = per_page * query_int(query.get("page"), "page", 0, 0)
        names = sorted(self.core.app.config.mcp_servers)
        servers = [_server_json(n) for n in names[start : start + per_page]]
        following: str | None = None
        if start + per_page < len(names):
            more = {"offset": start + per_page, "limit": per_page}
            if not legacy:
                more = {"page": (start + per_page) // per_page, "perPage": per_page}
            following = str(request.url.remove_query_params(_PAGING).include_query_params(**more))
        return json_response({"servers": servers, "total_count": len(names), "next": following})

    async def get_server(self, request: Request) -> Response:
        """``getMcpServerDetails(id)``: the server and how procmesh reaches it (never its secrets)."""
        server_id = self._server(request)
        config = self.core.app.config.mcp_servers[server_id]
        remotes = [{"transport_type": "streamable-http"}] if config.url else []
        packages = [] if config.url else [{"registry_name": "stdio", "name": server_id}]
        return json_response({**_server_json(server_id), "packages": packages, "remotes": remotes})

    def _tools(self, server_id: str) -> dict[str, McpServerTool]:
        return {
            tool.remote: tool
            for _, tool in all_tools(self.core).values()
            if isinstance(tool, McpServerTool) and tool.connection.config.name == server_id
        }

    async def list_tools(self, request: Request) -> Response:
        """``getMcpServerTools(id)``: the server's tools agents take (by the server's names)."""
        tools = self._tools(self._server(request))
        return json_response({"tools": [_tool_json(name, tool) for name, tool in sorted(tools.items())]})

    async def get_tool(self, request: Request) -> Response:
        """``getMcpServerTool(id, toolId).details()``."""
        server_id = self._server(request)
        tool_id = request.path_params["tool_id"]
        tool = self._tools(server_id).get(tool_id)
        if tool is None:
            raise CatalogNotFoundError(f"no agent takes tool {label(tool_id)} of {label(server_id)}")
        return json_response(_tool_json(tool.remote, tool))

    async def not_hosted(self, request: Request) -> Response:
        self._server(request)
        raise NotSupportedError(f"a hosted MCP server is not supported by procmesh: {SERVED_BY_NONE}")


def _server_json(name: str) -> dict[str, Any]:
    # procmesh does not know a configured server's version: the registry shape wants one
    version = {"version": "", "release_date": "", "is_latest": True}
    return {"id": name, "name": name, "version_detail": version}


def _tool_json(name: str, tool: McpServerTool) -> dict[str, Any]:
    schema = tool.input_schema
    return {"name": name, "description": tool.description, "inputSchema": schema, "toolType": "mcp"}
