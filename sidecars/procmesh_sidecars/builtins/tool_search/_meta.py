"""The meta-tools themselves: their specs and instructions, and what a call to each returns.

`search_tools` and `load_tool` run here whether the orchestrator routes the call to this
sidecar (``ExecuteTool``) or the processor completes a call it could not execute in the message
list; both paths share these functions, so the model sees the same result either way.
"""

from __future__ import annotations

from typing import Any

from procmesh_sidecars.builtins._common import Message
from procmesh_sidecars.builtins.tool_search._index import Catalog
from procmesh_sidecars.builtins.tool_search._options import SearchOptions

ACTIVATION_TYPE = "tool-search-auto-load"


def meta_tool_specs(auto_load: bool) -> list[dict[str, Any]]:
    """The meta-tools' specs; with auto-load, `search_tools` alone (it loads what it finds)."""
    search = {
        "name": "search_tools",
        "description": (
            "Search for available tools by keyword. Use this when you need a capability you don't "
            "currently have. "
            + (
                "Returns a list of matching tools, which are loaded automatically and become available "
                "on your next turn — no separate load step is required."
                if auto_load
                else "Returns a list of matching tools with their names and descriptions. After finding a "
                "useful tool, use load_tool to make it available."
            )
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "description": 'Search keywords (e.g., "weather", "github issue", "database query")',
                }
            },
            "required": ["query"],
        },
    }
    load = {
        "name": "load_tool",
        "description": (
            "Load one or more tools into your context. Call this after finding tools with search_tools. "
            "Once loaded, tools will be available for use. Pass a single toolName or an array of "
            "toolNames to load multiple tools at once."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "toolName": {"type": "string", "description": "The exact name of a tool to load"},
                "toolNames": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Exact tool names to load in one call",
                },
            },
        },
    }
    return [search] if auto_load else [search, load]


INSTRUCTION = (
    "To discover available tools, call search_tools with a keyword query. "
    "To add one or more tools to the conversation, call load_tool with a toolName or toolNames array. "
    "Tools must be loaded before they can be used."
)
INSTRUCTION_AUTO = (
    "To discover available tools, call search_tools with a keyword query. "
    "Matching tools are loaded automatically and become available on your next turn — "
    "there is no separate load step. After searching, use the tool directly."
)


def search_tools(query: str, catalog: Catalog, search: SearchOptions, loaded: list[str]) -> dict[str, Any]:
    """Run a `search_tools` call; with auto-load, add the hits to `loaded` (in place)."""
    results = catalog.search(query, search)
    if not results:
        return {"results": [], "message": f'No tools found matching "{query}". Try different keywords.'}
    if not search.auto_load:
        return {
            "results": results,
            "message": f"Found {len(results)} tool(s). Use load_tool with an exact toolName or a toolNames "
            "array to make them available.",
        }
    names = [r["name"] for r in results]
    fresh = [n for n in names if n not in loaded]
    loaded.extend(fresh)
    return {
        "results": results,
        "activation": {"type": ACTIVATION_TYPE, "version": 1, "loaded": names},
        "message": f"Found and loaded {len(results)} tool(s): {', '.join(names)}. They are available on "
        "your next turn — call them directly."
        + (" Some were already loaded." if len(fresh) < len(names) else ""),
    }


def load_tool(args: dict[str, Any], catalog: Catalog, loaded: list[str]) -> dict[str, Any]:
    """Run a `load_tool` call (``toolName`` and/or ``toolNames``), adding to `loaded` in place."""
    tool_name = args.get("toolName")
    tool_names = args.get("toolNames")
    names_given = tool_names is not None
    if names_given and not tool_names and not tool_name:
        return {"success": False, "message": "toolNames array must not be empty."}
    if names_given and tool_names:
        to_load = list(dict.fromkeys([*map(str, tool_names), *([str(tool_name)] if tool_name else [])]))
    elif tool_name:
        to_load = [str(tool_name)]
    else:
        return {
            "success": False,
            "message": "You must provide either toolName (string) or toolNames (array) to load.",
        }
    not_found, already, fresh = [], [], []
    for name in to_load:
        if name not in catalog.tools:
            not_found.append(name)
        elif name in loaded or name in fresh:
            already.append(name)
        else:
            fresh.append(name)
    loaded.extend(fresh)
    if len(to_load) == 1 and not names_given:
        name = to_load[0]
        if not_found:
            hints = catalog.suggestions(name)
            message = f'Tool "{name}" not found.' + (
                f" Did you mean: {', '.join(hints)}?"
                if hints
                else " Use search_tools to find available tools."
            )
            return {"success": False, "message": message, "toolName": name}
        if already:
            return {
                "success": True,
                "message": f'Tool "{name}" is already loaded and available.',
                "toolName": name,
                "loaded": [name],
            }
        return {
            "success": True,
            "message": f'Tool "{name}" loaded successfully. It will be available on your next turn.',
            "toolName": name,
            "loaded": [name],
        }
    parts = []
    if fresh:
        parts.append(f"Loaded: {', '.join(fresh)} — available on your next turn")
    if already:
        parts.append(f"Already loaded: {', '.join(already)}")
    if not_found:
        parts.append(f"Not found: {', '.join(not_found)}")
    out: dict[str, Any] = {"success": not not_found, "message": " | ".join(parts), "loadedCount": len(fresh)}
    if fresh:
        out["loaded"] = fresh
    if not_found:
        out["notFound"] = not_found
    if already:
        out["alreadyLoaded"] = already
    return out


def loaded_from_context(messages: list[Message]) -> list[str]:
    """Names loaded by completed `load_tool` results and auto-load `search_tools` activations."""
    names: list[str] = []
    for msg in messages:
        for part in (msg.get("content") or {}).get("parts") or []:
            inv = part.get("toolInvocation") if part.get("type") == "tool-invocation" else None
            if not inv or inv.get("state") != "result" or not isinstance(inv.get("result"), dict):
                continue
            result = inv["result"]
            if inv.get("toolName") == "load_tool":
                found = [*(result.get("loaded") or []), *(result.get("alreadyLoaded") or [])]
            elif inv.get("toolName") == "search_tools" and isinstance(result.get("activation"), dict):
                found = list(result["activation"].get("loaded") or [])
            else:
                continue
            names += [str(n) for n in found if str(n) not in names]
    return names
