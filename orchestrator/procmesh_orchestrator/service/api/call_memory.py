"""A call's memory: the body's ``memory`` object (thread, resource, per-call memory options) and
the rule that scopes a call's thread and resource to its caller (`memory_scope`), for both APIs."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from procmesh_orchestrator.config.history import MessageHistoryConfig
from procmesh_orchestrator.run.framework.memory import MemoryCallOptions
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import BadRequestError
from procmesh_orchestrator.store import MAX_ID_CHARS


class _ThreadRef(BaseModel):
    """``memory.thread`` as ``{id, ...}``: the reference's other keys (``title``, ``metadata``) are
    kept aside for the call's warnings (`IGNORED_OPTIONS`)."""

    model_config = ConfigDict(extra="allow")

    id: str


class _MemoryOptions(BaseModel):
    """``memory.options``: the reference's per-call memory config, the keys procmesh takes (any
    other is refused by name)."""

    model_config = ConfigDict(extra="forbid")

    last_messages: StrictInt | Literal[False] | None = Field(default=None, alias="lastMessages", ge=0)
    read_only: bool | None = Field(default=None, alias="readOnly")
    semantic_recall: bool | None = Field(default=None, alias="semanticRecall")
    message_history: MessageHistoryConfig | None = Field(default=None, alias="messageHistory")

    def options(self) -> MemoryCallOptions:
        window = 0 if self.last_messages is False else self.last_messages
        budget = None if self.message_history is None else self.message_history.budget()
        return MemoryCallOptions(window, self.read_only, self.semantic_recall, budget)


class MemoryBody(BaseModel):
    """The body's ``memory``: the thread as its id or ``{id, ...}``, the resource, the options, and
    ``readOnly`` (the reference's shorthand for ``options.readOnly``, which wins when both are given);
    any other key is refused by name."""

    model_config = ConfigDict(extra="forbid")

    thread: str | _ThreadRef | None = None
    resource: str | None = None
    options: _MemoryOptions | None = None
    read_only: bool | None = Field(default=None, alias="readOnly")

    def ignored(self) -> list[str]:
        """The thread object's keys procmesh does not apply, by their body path."""
        thread = self.thread if isinstance(self.thread, _ThreadRef) else None
        return [f"memory.thread.{key}" for key in sorted(thread.model_extra or {})] if thread else []

    def call_options(self) -> MemoryCallOptions:
        options = self.options.options() if self.options else MemoryCallOptions()
        if options.read_only is None and self.read_only is not None:
            return replace(options, read_only=self.read_only)
        return options

    @property
    def thread_id(self) -> str | None:
        return self.thread.id if isinstance(self.thread, _ThreadRef) else self.thread


def memory_scope(thread: str | None, resource: str | None, *, caller: Caller) -> tuple[str, str]:
    """The (thread, resource) a call runs with; memory loads and saves only with both.

    The resource scopes per-user data (memory threads, response-cache entries), so it is the
    caller's API key's: a key bound to a resource runs as that one (claiming another is refused);
    an operator key (or any caller when no key is configured) names the resource it acts for, or
    none. The thread is the caller's to name, within that resource: the store scopes threads by
    resource, so no caller reads another's history. A thread without a resource is refused (a
    400 naming resourceId): the run could neither load nor save it, and doing it silently would
    lose the turn.
    """
    for name, value in (("threadId", thread), ("resourceId", resource)):
        # refused here, as a 400, rather than by the store once the run has started
        if value and (len(value) > MAX_ID_CHARS or not value.isprintable()):
            raise BadRequestError(f"{name}: must be a printable id of at most {MAX_ID_CHARS} characters")
    if caller.resource is not None:
        if resource and resource != caller.resource:
            raise BadRequestError("resourceId: this API key is bound to another resource")
        resource = caller.resource
    elif not caller.operator:
        resource = None
    if not resource:
        if thread:
            raise BadRequestError(
                "threadId: a thread belongs to a resource (a user, an org); name it with resourceId, "
                "or call with an API key bound to one (PROCMESH_API_KEYS key=resource)"
            )
        return "", ""
    return thread or "", resource
