"""Working memory in the run: the reference's ``working-memory`` processor and its
``updateWorkingMemory`` tool (issue 29).

At processInput, ahead of the history, the processor adds one system message: the reference's
instruction (its text, word for word) with the template and the stored data, or its read-only
text when the call may not write. The model updates the memory with ``updateWorkingMemory``:
Markdown mode replaces the text (``{memory: string}``; a bare template over stored data is
refused, as the reference refuses it); schema mode merges the given JSON into the stored JSON
(``null`` deletes a field, arrays are replaced: the reference's ``deepMergeWorkingMemory``). The
merge runs under the store's row lock, so updates from two replicas both land.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from procmesh_orchestrator.errors import InvalidMemoryInputError, MemoryStoreError
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run.framework import FrameworkProcessor
from procmesh_orchestrator.run.hooks import HookArgs, InputArgs
from procmesh_orchestrator.run.tools import ToolCall, ToolOutcome, Writer
from procmesh_orchestrator.store import MemoryStore, client_message
from procmesh_orchestrator.store.working_memory import RESOURCE_SCOPE

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore
    from procmesh_orchestrator.run.framework.memory import AgentMemory

log = logging.getLogger(__name__)
R = TypeVar("R")

TOOL_NAME = "updateWorkingMemory"
DEFAULT_TEMPLATE = """
# User Information
- **First Name**: 
- **Last Name**: 
- **Location**: 
- **Occupation**: 
- **Interests**: 
- **Goals**: 
- **Events**: 
- **Facts**: 
- **Projects**: 
"""  # noqa: W291 - the reference's template, trailing spaces included
"""The reference's default template (``Memory.defaultWorkingMemoryTemplate``)."""


def js_json(value: Any) -> str:
    """``JSON.stringify(value)``: what the reference stores and shows."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class WorkingMemorySettings:
    """An agent's working memory: scope, and the template or JSON Schema the model fills in."""

    scope: str = "resource"
    template: str | None = None
    schema: dict[str, Any] | None = None
    agent_managed: bool = True

    @property
    def format(self) -> str:
        """``json`` with a schema, else ``markdown``."""
        return "json" if self.schema is not None else "markdown"

    @property
    def template_content(self) -> str:
        """The template as the reference gives it: the trimmed Markdown, or the schema as JSON."""
        if self.schema is not None:
            return js_json(self.schema)
        return (self.template or DEFAULT_TEMPLATE).strip()

    @property
    def shown_template(self) -> str:
        """The template as the reference's API shows it: the Markdown, or the schema's empty
        object as JSON (``workingMemoryTemplate.content``)."""
        if self.schema is not None:
            return js_json(empty_from_schema(self.schema))
        return self.template_content

    def thread_key(self, thread_id: str) -> str:
        """The store's thread key of this scope: the thread's id, or "" for the resource's."""
        return thread_id if self.scope == "thread" else RESOURCE_SCOPE


def empty_from_schema(schema: Any) -> dict[str, Any]:
    """The reference's ``generateEmptyFromSchema``: each property's default or empty value."""
    if not isinstance(schema, dict) or schema.get("type") != "object" or not schema.get("properties"):
        return {}
    empty: dict[str, Any] = {}
    blank = {"string": "", "array": [], "number": 0, "integer": 0, "boolean": False}
    for key, prop in schema["properties"].items():
        prop = prop if isinstance(prop, dict) else {}
        if "default" in prop:
            empty[key] = prop["default"]
        elif prop.get("type") == "object":
            empty[key] = empty_from_schema(prop) if prop.get("properties") else {}
        else:
            empty[key] = blank.get(str(prop.get("type")))
    return empty


def instruction(settings: WorkingMemorySettings, data: str | None, *, read_only: bool) -> str:
    """The system message the reference's ``WorkingMemory`` processor adds (1.71 wording)."""
    if read_only or not settings.agent_managed:
        return _READ_ONLY.format(data=data or "No working memory data available.")
    is_json = settings.format == "json"
    kind = "JSON" if is_json else "Markdown"
    empty = empty_from_schema(settings.schema) if is_json else {}
    return _INSTRUCTION.format(
        kind=kind,
        string_rules="" if is_json else _STRING_RULES,
        template=""
        if is_json
        else f"<working_memory_template>\n{settings.template_content}\n</working_memory_template>",
        empty_intro="When working with json data, the object format below represents the template:"
        if empty
        else "",
        empty=js_json(empty) if empty else "",
        data="null" if data is None else data,  # the reference's `${data}` of a missing memory
    )


_STRING_RULES = """5. IMPORTANT: When calling updateWorkingMemory, the only valid parameter is the memory field. DO NOT pass an object.
6. IMPORTANT: ALWAYS pass the data you want to store in the memory field as a string. DO NOT pass an object.
7. IMPORTANT: Data must only be sent as a string no matter which format is used."""  # noqa: E501

_INSTRUCTION = """WORKING_MEMORY_SYSTEM_INSTRUCTION:
Store and update any conversation-relevant information by calling the updateWorkingMemory tool. If information might be referenced again - store it!

Guidelines:
1. Store anything that could be useful later in the conversation
2. Update proactively when information changes, no matter how small
3. Use {kind} format for all data
4. Act naturally - don't mention this system to users. Even though you're storing this information that doesn't make it your primary focus. Do not ask them generally for "information about yourself"
{string_rules}


{template}

{empty_intro}
{empty}

<working_memory_data>
{data}
</working_memory_data>

Notes:
- Update memory whenever referenced information changes
- If you're unsure whether to store something, store it (eg if the user tells you information about themselves, call updateWorkingMemory immediately to update it)
- This system is here so that you can maintain the conversation when your context window is very short. Update your working memory because you may need it to maintain the conversation without the full conversation history
- Do not remove empty sections - you must include the empty sections along with the ones you're filling in
- REMEMBER: the way you update your working memory is by calling the updateWorkingMemory tool with the entire {kind} content. The system will store it for you. The user will not see it.
- IMPORTANT: You MUST call updateWorkingMemory in every response to a prompt where you received relevant information.
- IMPORTANT: Preserve the {kind} formatting structure above while updating the content."""  # noqa: E501

_READ_ONLY = """WORKING_MEMORY_SYSTEM_INSTRUCTION (READ-ONLY):
The following is your working memory - persistent information about the user and conversation collected over previous interactions. This data is provided for context to help you maintain continuity.

<working_memory_data>
{data}
</working_memory_data>

Guidelines:
1. Use this information to provide personalized and contextually relevant responses
2. Act naturally - don't mention this system to users. This information should inform your responses without being explicitly referenced
3. This memory is read-only in the current session - you cannot update it

Notes:
- This system is here so that you can maintain the conversation when your context window is very short
- The user will not see the working memory data directly"""  # noqa: E501


def deep_merge(existing: Any, update: Any) -> dict[str, Any]:
    """The reference's ``deepMergeWorkingMemory``: objects merge key by key, ``null`` deletes,
    arrays and other values replace."""
    base = dict(existing) if isinstance(existing, dict) else {}
    if not isinstance(update, dict) or not update:
        return base
    for key, value in update.items():
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict):
            base[key] = deep_merge(base.get(key) if isinstance(base.get(key), dict) else None, value)
        else:
            base[key] = value
    return base


_SPACES = re.compile(r"\s+")


def _normalized(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


async def update(
    store: MemoryStore,
    settings: WorkingMemorySettings,
    resource_id: str,
    thread_id: str,
    memory: Any,
) -> dict[str, Any]:
    """What one ``updateWorkingMemory`` call does, as the reference's tool answers it: Markdown
    replaces (never with the bare template over stored data), JSON merges, under the row's lock."""
    key = settings.thread_key(thread_id)
    if settings.format == "json":
        if memory is None:
            return {"success": True, "message": "No memory data provided, existing memory unchanged."}
        if isinstance(memory, str):
            try:
                memory = json.loads(memory)
            except ValueError as exc:
                shown = memory if len(memory) <= 500 else memory[:500] + "..."
                raise InvalidMemoryInputError(
                    f"Failed to parse working memory input as JSON: {exc}. Raw input: {shown}"
                ) from None

        def merge(stored: str | None) -> str:
            try:
                existing = json.loads(stored) if stored else None
            except ValueError:
                existing = None
            return js_json(deep_merge(existing, memory))

        await store.update_working_memory(resource_id, key, merge)
        return {"success": True}
    text = memory if isinstance(memory, str) else js_json(memory)
    template = _normalized(settings.template_content)
    refused = False

    def replace(stored: str | None) -> str | None:
        nonlocal refused
        if stored and _normalized(text) == template and _normalized(stored) != template:
            refused = True
            return None
        return text

    await store.update_working_memory(resource_id, key, replace)
    if refused:
        return {
            "success": False,
            "message": "Attempted to replace existing working memory with empty template. "
            "Update skipped to prevent data loss.",
        }
    return {"success": True}


def working_memory_config(settings: WorkingMemorySettings) -> dict[str, Any]:
    """The settings as the reference's memory config shows them (``getMemoryConfig``)."""
    shown: dict[str, Any] = {"enabled": True, "scope": settings.scope}
    if settings.schema is not None:
        shown["schema"] = settings.schema
    else:
        shown["template"] = settings.template_content
    if not settings.agent_managed:
        shown["agentManaged"] = False
    return shown


def locate(
    agent_id: str, memory: AgentMemory | None, thread_id: str
) -> tuple[MemoryStore, WorkingMemorySettings, str]:
    """The agent's store, working memory and the store's thread key for `thread_id`
    (`InvalidMemoryInputError` when it has no working memory, or a thread-scoped one no thread)."""
    if memory is None or memory.working_memory is None:
        raise InvalidMemoryInputError(f"agent {agent_id!r} has no working memory (memory.workingMemory)")
    settings = memory.working_memory
    if settings.scope == "thread" and not thread_id:
        raise InvalidMemoryInputError("threadId: required (the working memory is thread-scoped)")
    return memory.store, settings, settings.thread_key(thread_id)


def check_text(settings: WorkingMemorySettings, text: object) -> str:
    """`text` when it may replace the working memory: a string (JSON text for a schema memory)."""
    if not isinstance(text, str):
        raise InvalidMemoryInputError("workingMemory: must be a string")
    if settings.format == "json":
        try:
            json.loads(text)
        except ValueError as exc:
            raise InvalidMemoryInputError(
                f"workingMemory: the agent's working memory is JSON: {exc}"
            ) from None
    return text


async def read(
    agent_id: str, memory: AgentMemory | None, resource_id: str, thread_id: str = ""
) -> str | None:
    """The agent's working memory for the resource (or its thread, thread-scoped), or None."""
    store, _, key = locate(agent_id, memory, thread_id)
    stored = await store.get_working_memory(resource_id, key)
    return stored.text if stored else None


async def write(
    agent_id: str, memory: AgentMemory | None, resource_id: str, text: str, thread_id: str = ""
) -> None:
    """Replace the agent's working memory for the resource (or its thread) with `text` (the
    reference's ``Memory.updateWorkingMemory``: no merge; JSON mode takes JSON text only)."""
    store, settings, key = locate(agent_id, memory, thread_id)
    new = check_text(settings, text)
    await store.update_working_memory(resource_id, key, lambda old: new)


@dataclass(frozen=True)
class UpdateWorkingMemoryTool:
    """The reference's ``updateWorkingMemory`` tool, bound to one call's resource and thread."""

    store: MemoryStore
    settings: WorkingMemorySettings
    resource_id: str
    thread_id: str
    name: str = TOOL_NAME
    requires_approval: bool = False

    @property
    def description(self) -> str:
        if self.settings.format == "json":
            return (
                "Update the working memory with new information. Data is merged with existing memory - "
                "only include fields you want to add or update. To preserve existing data, omit the "
                "field entirely. Arrays are replaced entirely when provided, so pass the complete array "
                "or omit it to keep the existing values."
            )
        return (
            "Update the working memory with new information. Any data not included will be overwritten. "
            "Always pass data as string to the memory field. Never pass an object."
        )

    @property
    def input_schema(self) -> dict[str, Any]:
        if self.settings.schema is not None:
            schema = {k: v for k, v in self.settings.schema.items() if k != "$schema"}
            return {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "type": "object",
                "description": "The JSON formatted working memory content to store.",
                "properties": {"memory": schema},
                "required": ["memory"],
            }
        return {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {
                "memory": {
                    "type": "string",
                    "description": "The Markdown formatted working memory content to store. "
                    "This MUST be a string. Never pass an object.",
                }
            },
            "required": ["memory"],
        }

    async def execute(self, run: RunCore, call: ToolCall, writer: Writer) -> ToolOutcome:
        """Update the memory; what the model reads back is the reference's answer, or the error."""
        memory = call.args.get("memory") if isinstance(call.args, dict) else None
        try:
            return ToolOutcome(
                await update(self.store, self.settings, self.resource_id, self.thread_id, memory)
            )
        except InvalidMemoryInputError as exc:
            return ToolOutcome(error=str(exc))
        except Exception as exc:  # the store failed: the model is told, the log has the whole error
            log.error("run %s: updating the working memory failed: %s", run.run_id, exc)
            return ToolOutcome(error="updating the working memory failed: the memory store failed")


class WorkingMemoryProcessor(FrameworkProcessor):
    """Adds the working memory's instruction and data as a system message at processInput,
    before the history loads (the reference's ``working-memory``, first of memory's processors)."""

    processor_id = "working-memory"
    hooks = frozenset({"process_input"})

    def __init__(
        self,
        store: MemoryStore,
        settings: WorkingMemorySettings,
        resource_id: str,
        thread_id: str,
        read_only: bool,
    ) -> None:
        self.store = store
        self.settings = settings
        self.resource_id = resource_id
        self.thread_id = thread_id
        self.read_only = read_only
        self.key = f"memory:{self.processor_id}"
        self.added: dict[str, Any] | None = None
        """The system message it added (what memory's record for replay keeps of it)."""

    async def run_hook(self, run: RunCore, args: HookArgs[R]) -> R | None:
        if isinstance(args, InputArgs):
            try:
                stored = await self.store.get_working_memory(
                    self.resource_id, self.settings.thread_key(self.thread_id)
                )
            except MemoryStoreError as exc:  # the client reads what failed, never the store's address
                log.error("run %s: loading the working memory failed: %s", run.run_id, exc)
                raise type(exc)(f"memory: loading the working memory failed: {client_message(exc)}") from exc
            text = instruction(self.settings, stored.text if stored else None, read_only=self.read_only)
            self.added = msgs.text_message("system", text)
            run.system.append(self.added)
        return None

    def tool(self) -> UpdateWorkingMemoryTool | None:
        """The tool the model updates the memory with; None when it may not."""
        if self.read_only or not self.settings.agent_managed:
            return None
        return UpdateWorkingMemoryTool(self.store, self.settings, self.resource_id, self.thread_id)
