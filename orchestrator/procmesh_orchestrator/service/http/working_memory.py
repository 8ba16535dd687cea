"""The working-memory routes @mastra/client-js 1.47 calls (``getWorkingMemory``,
``updateWorkingMemory``), in the reference server's shapes. They act for the caller's resource,
as every memory route does (`api.memory.scope`); the thread in the path must be one of it for an
update (404 otherwise, as the reference answers a missing thread)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from procmesh_orchestrator.run.framework import working_memory
from procmesh_orchestrator.service.api.memory import check_id, input_errors, owned, store_errors
from procmesh_orchestrator.service.http.bodies import route
from procmesh_orchestrator.service.http.memory import _SCOPE, MemoryRoutes, _json


class WorkingMemoryRoutes(MemoryRoutes):
    """``/api/memory/threads/{threadId}/working-memory`` (GET and POST)."""

    def routes(self) -> list[Route]:
        path = "/api/memory/threads/{thread_id}/working-memory"
        return [
            route(path, self.get, "GET", *_SCOPE),
            route(path, self.update, "POST", *_SCOPE),
        ]

    async def get(self, request: Request) -> Response:
        """``{workingMemory, source, workingMemoryTemplate, threadExists}`` (the reference's)."""
        store, resource = self._scope(request, agent_required=True)
        agent_id = request.query_params["agentId"]
        thread_id = check_id("threadId", request.path_params["thread_id"])
        memory = self.core.agent(agent_id).spec.memory
        settings = memory.working_memory if memory is not None else None
        with store_errors(store, "reading the thread", thread_id):
            exists = await store.get_thread(thread_id, resource) is not None
        if settings is None:  # the reference's answer for an agent without working memory
            body: dict[str, Any] = {"workingMemory": None, "source": "thread", "workingMemoryTemplate": None}
            return _json({**body, "threadExists": exists})
        with input_errors():
            _, settings, key = working_memory.locate(agent_id, memory, thread_id)
        with store_errors(store, "reading the working memory", thread_id):
            stored = await store.get_working_memory(resource, key)
        content = settings.shown_template
        return _json(
            {
                "workingMemory": stored.text if stored else None,
                "source": settings.scope,
                "workingMemoryTemplate": {"format": settings.format, "content": content},
                "threadExists": exists,
            }
        )

    async def update(self, request: Request) -> Response:
        """``{workingMemory, resourceId?}``: replaces the working memory (``{success: true}``)."""
        body = await self._body(request, {"workingMemory", "resourceId"}, "memoryConfig is per agent")
        store, resource = self._scope(request, claimed=body.get("resourceId"), agent_required=True)
        agent_id = request.query_params["agentId"]
        thread = await owned(store, request.path_params["thread_id"], resource)
        memory = self.core.agent(agent_id).spec.memory
        with input_errors():
            _, settings, key = working_memory.locate(agent_id, memory, thread.id)
            text = working_memory.check_text(settings, body.get("workingMemory"))
        with store_errors(store, "updating the working memory", thread.id):
            await store.update_working_memory(resource, key, lambda old: text)
        return _json({"success": True})
