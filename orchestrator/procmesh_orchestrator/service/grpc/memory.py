"""AgentService's working-memory RPCs (GetWorkingMemory, UpdateWorkingMemory) and a request's
memory options: the same working memory the HTTP routes and the model's tool keep, for the
caller's resource (`api.memory.scope`), with the store's errors as the API's."""

from __future__ import annotations

from typing import Any

from procmesh.v1 import agent_pb2 as apb
from procmesh_orchestrator.run.framework import working_memory
from procmesh_orchestrator.run.framework.history_budget import HistoryBudget
from procmesh_orchestrator.run.framework.memory import MemoryCallOptions
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import BadRequestError
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.api.memory import input_errors, owned, scope, store_errors


def memory_options(request: Any) -> MemoryCallOptions:
    """A GenerateRequest's / StreamRequest's ``memory_options`` (unset fields: the agent's)."""
    if not request.HasField("memory_options"):
        return MemoryCallOptions()
    given = request.memory_options
    window = given.last_messages if given.HasField("last_messages") else None
    if window is not None and window < 0:
        raise BadRequestError("memory_options.last_messages: must be 0 or more")
    budget = None
    if given.HasField("message_history"):
        history = given.message_history
        remove = history.at_max_remove_tokens if history.HasField("at_max_remove_tokens") else None
        try:
            budget = HistoryBudget.of(history.max_tokens, remove)
        except ValueError as exc:
            raise BadRequestError(f"memory_options.message_history: {exc}") from exc
    return MemoryCallOptions(
        window,
        given.read_only if given.HasField("read_only") else None,
        given.semantic_recall if given.HasField("semantic_recall") else None,
        budget,
    )


def _whose(service: ServiceCore, request: Any, caller: Caller) -> tuple[Any, str]:
    store, resource = scope(
        service,
        caller,
        agent_id=request.agent_id,
        claimed=request.resource_id,
        request_context=dict,  # gRPC carries no request context on these calls
        agent_required=True,
    )
    return store, resource


async def get_working_memory(
    service: ServiceCore, request: apb.GetWorkingMemoryRequest, caller: Caller
) -> apb.GetWorkingMemoryResponse:
    """The agent's working memory for the caller's resource (or its thread)."""
    store, resource = _whose(service, request, caller)
    memory = service.agent(request.agent_id).spec.memory
    with input_errors():
        _, settings, key = working_memory.locate(request.agent_id, memory, request.thread_id)
    with store_errors(store, "reading the working memory", request.thread_id):
        stored = await store.get_working_memory(resource, key)
    template = settings.shown_template
    reply = apb.GetWorkingMemoryResponse(source=settings.scope, format=settings.format, template=template)
    if stored is not None:
        reply.working_memory = stored.text
    return reply


async def update_working_memory(
    service: ServiceCore, request: apb.UpdateWorkingMemoryRequest, caller: Caller
) -> apb.UpdateWorkingMemoryResponse:
    """Replace the agent's working memory for the caller's resource (or its thread: one of the
    caller's resource, NOT_FOUND otherwise, as over HTTP; a text kept for a thread that is not
    there would be lost without a word)."""
    store, resource = _whose(service, request, caller)
    memory = service.agent(request.agent_id).spec.memory
    with input_errors():
        _, settings, key = working_memory.locate(request.agent_id, memory, request.thread_id)
        text = working_memory.check_text(settings, request.working_memory)
    if settings.scope == "thread":
        await owned(store, request.thread_id, resource)
    with store_errors(store, "updating the working memory", request.thread_id):
        await store.update_working_memory(resource, key, lambda old: text)
    return apb.UpdateWorkingMemoryResponse()
