"""The `tool-search` processor: adds the meta-tools and the loaded tools to each step."""

from __future__ import annotations

import time
from typing import Any

from procmesh import Processor
from procmesh_sidecars.builtins._common import Message
from procmesh_sidecars.builtins.tool_search._index import META_TOOLS, Catalog, short
from procmesh_sidecars.builtins.tool_search._meta import (
    INSTRUCTION,
    INSTRUCTION_AUTO,
    load_tool,
    loaded_from_context,
    meta_tool_specs,
    search_tools,
)
from procmesh_sidecars.builtins.tool_search._options import ToolSearchOptions


class ToolSearch(Processor):
    """Gives the model `search_tools` and `load_tool` instead of the whole tool library."""

    id = "tool-search"
    name = "Tool Search Processor"
    description = "Enables dynamic tool discovery and loading via search"
    Options = ToolSearchOptions

    def __init__(self) -> None:
        self._threads: dict[str, tuple[float, list[str]]] = {}

    def _thread_loaded(self, thread_id: str, ttl_ms: float) -> list[str]:
        now = time.monotonic()
        if ttl_ms:
            for key, (seen, _) in list(self._threads.items()):
                if (now - seen) * 1000 > ttl_ms:
                    del self._threads[key]
        entry = self._threads.get(thread_id)
        return list(entry[1]) if entry else []

    async def process_input_step(
        self,
        messages: list[Message],
        system_messages: list[Message],
        tools: list[dict[str, Any]],
        options: ToolSearchOptions,
        state: dict[str, Any],
        thread_id: str,
        abort: Any,
    ) -> dict[str, Any]:
        for tool in tools:
            if tool["name"] in META_TOOLS:
                abort(
                    f"tool-search cannot add its {tool['name']!r} meta-tool: "
                    "the agent already has a tool by that name"
                )
        catalog_specs = [t.model_dump(by_alias=True) for t in options.tools]
        if options.include_resolved_tools:
            known = {t["name"] for t in catalog_specs}
            catalog_specs += [t for t in tools if t["name"] not in known]
        try:
            catalog = Catalog(catalog_specs)
        except ValueError as exc:
            abort(str(exc))

        loaded: list[str] = list(state.get("loaded") or [])
        if options.storage == "in-memory" and thread_id:
            loaded += [n for n in self._thread_loaded(thread_id, options.ttl) if n not in loaded]
        if options.storage == "context":
            loaded += [n for n in loaded_from_context(messages) if n not in loaded]

        # Run the meta-tool calls the orchestrator could not execute, in conversation order.
        new_messages: list[Message] = []
        changed = False
        for msg in messages:
            parts = (msg.get("content") or {}).get("parts")
            if msg.get("role") != "assistant" or not isinstance(parts, list):
                new_messages.append(msg)
                continue
            new_parts = []
            touched = False
            for part in parts:
                inv = part.get("toolInvocation") if part.get("type") == "tool-invocation" else None
                if inv and inv.get("toolName") in META_TOOLS and inv.get("state") in ("call", "output-error"):
                    result = self._execute(inv, catalog, options, loaded)
                    done = {k: v for k, v in inv.items() if k != "errorText"}
                    done.update(state="result", result=result)
                    part = {**part, "toolInvocation": done}
                    touched = changed = True
                new_parts.append(part)
            new_messages.append(
                {**msg, "content": {**msg["content"], "parts": new_parts}} if touched else msg
            )

        state["loaded"] = loaded
        state["catalog"] = catalog_specs  # execute_tool searches the same catalog
        if options.storage == "in-memory" and thread_id:
            self._threads[thread_id] = (time.monotonic(), list(loaded))

        auto = options.search.auto_load
        system = [
            *system_messages,
            _system("tool-search-instructions", INSTRUCTION_AUTO if auto else INSTRUCTION),
        ]
        if options.inject_catalog and catalog.tools:
            lines = [
                f"- `{n}`: {short(str(t.get('description', '')))}" if t.get("description") else f"- `{n}`"
                for n, t in catalog.tools.items()
            ]
            intro = (
                "The following tools are available. Call search_tools with a keyword to load one — "
                "matching tools are loaded automatically and become available on your next turn."
                if auto
                else "The following tools are available to load. Call load_tool with a toolName or toolNames "
                "array to add one or more before using them — no search step is required. search_tools is "
                "also available if you need to rediscover tools by keyword."
            )
            system.append(_system("tool-search-catalog", intro + "\n\nAvailable tools:\n" + "\n".join(lines)))

        always = [] if options.include_resolved_tools else [t for t in tools if t["name"] not in loaded]
        step_tools = meta_tool_specs(auto) + always + [catalog.tools[n] for n in loaded if n in catalog.tools]
        out: dict[str, Any] = {"system_messages": system, "tools": step_tools}
        if changed:
            out["messages"] = new_messages
        return out

    async def execute_tool(
        self, tool_name: str, args: Any, options: ToolSearchOptions, state: dict[str, Any], thread_id: str
    ) -> dict[str, Any]:
        """Run `search_tools` / `load_tool` (the orchestrator routes their calls here)."""
        specs = state.get("catalog")
        catalog = Catalog(
            specs if isinstance(specs, list) else [t.model_dump(by_alias=True) for t in options.tools]
        )
        loaded: list[str] = list(state.get("loaded") or [])
        result = self._execute({"toolName": tool_name, "args": args}, catalog, options, loaded)
        state["loaded"] = loaded
        if options.storage == "in-memory" and thread_id:
            self._threads[thread_id] = (time.monotonic(), list(loaded))
        return result

    def _execute(
        self, inv: dict[str, Any], catalog: Catalog, options: ToolSearchOptions, loaded: list[str]
    ) -> dict[str, Any]:
        raw = inv.get("args")
        args: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if inv.get("toolName") == "search_tools":
            return search_tools(str(args.get("query", "")), catalog, options.search, loaded)
        return load_tool(args, catalog, loaded)


def _system(msg_id: str, text: str) -> Message:
    return {
        "id": msg_id,
        "role": "system",
        "content": {"format": 2, "parts": [{"type": "text", "text": text}]},
    }
