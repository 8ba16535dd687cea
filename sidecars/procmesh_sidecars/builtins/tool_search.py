"""`tool-search`: runtime tool discovery through the `search_tools` / `load_tool` meta-tools.

Instead of sending a large tool library with every request, the model gets two
meta-tools: `search_tools` (BM25 over tool names and descriptions, with a name
boost) and `load_tool`. Loaded tools are added to the step's tools from the
next step on; the loaded set lives in the run's state (and, with a thread id,
in this sidecar's memory for `ttl` ms; or in the conversation with
``storage: context``).

How the meta-tools run: ``processInputStep`` adds their specs to the step's
tools, and the orchestrator routes a call to a tool the agent does not have to
the processor that added it (``ExecuteTool``), so ``search_tools`` and
``load_tool`` run here and their results flow like any tool's (a
``tool-result`` chunk, ``steps[].toolResults``). An orchestrator without
``ExecuteTool`` reports such a call as an ``output-error`` invocation; at the
next step this processor still completes it in the message list, so the model
sees the result either way. Loaded tools are executed by the orchestrator, so a
catalog tool must also be one of the agent's tools to run (list the library as
the agent's tools and set ``include_resolved_tools`` to withhold it until
loaded).
"""

from __future__ import annotations

import math
import re
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from procmesh import Processor
from procmesh_sidecars.builtins._common import Message

META_TOOLS = ("search_tools", "load_tool")
_SPLIT = re.compile(r"""[\s\-_.,;:!?()\[\]{}'"]+""")
_K1 = 1.5
_B = 0.75
_DESCRIPTION_LIMIT = 150
ACTIVATION_TYPE = "tool-search-auto-load"


class ToolSpecModel(BaseModel):
    """A tool as the model sees it."""

    model_config = ConfigDict(populate_by_name=True)

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=dict, alias="inputSchema")


class SearchOptions(BaseModel):
    """`search` options."""

    top_k: int = Field(default=5, ge=1)
    min_score: float = 0.0
    auto_load: bool = False
    """`search_tools` loads what it finds (no `load_tool` meta-tool)."""


class ToolSearchOptions(BaseModel):
    """Options of `tool-search`."""

    tools: list[ToolSpecModel] = []
    """The searchable catalog (specs; to run, a tool must also be one of the agent's tools)."""
    include_resolved_tools: bool = False
    """Also make the agent's own tools for this request searchable, and withhold them until loaded."""
    inject_catalog: bool = False
    """List the catalog (name and short description) in a system message, so the model can load directly."""
    search: SearchOptions = SearchOptions()
    storage: Literal["in-memory", "context"] = "in-memory"
    """``in-memory``: the run's state, plus this sidecar's memory per thread id (with `ttl`);
    ``context``: derived from the completed meta-tool results in the conversation."""
    ttl: float = Field(default=3_600_000, ge=0)
    """In-memory thread entries expire after this many ms without use (0: never)."""


def tokenize(text: str) -> list[str]:
    """Lowercase terms of at least two characters, split on whitespace and punctuation."""
    return [t for t in _SPLIT.split(text.lower()) if len(t) >= 2]


class BM25:
    """A small BM25 index (k1 1.5, b 0.75, IDF ln((N - df + 0.5) / (df + 0.5) + 1))."""

    def __init__(self, docs: dict[str, str]) -> None:
        self.terms = {doc_id: tokenize(text) for doc_id, text in docs.items()}
        self.df: dict[str, int] = {}
        for terms in self.terms.values():
            for term in set(terms):
                self.df[term] = self.df.get(term, 0) + 1
        total = sum(len(t) for t in self.terms.values())
        self.avg = total / len(self.terms) if self.terms else 0.0

    def search(self, query: str) -> list[tuple[str, float]]:
        """Documents matching any query term, best first."""
        n = len(self.terms)
        scores: dict[str, float] = {}
        for term in tokenize(query):
            df = self.df.get(term)
            if not df:
                continue
            idf = math.log((n - df + 0.5) / (df + 0.5) + 1)
            for doc_id, terms in self.terms.items():
                tf = terms.count(term)
                if tf:
                    norm = tf + _K1 * (1 - _B + _B * (len(terms) / self.avg))
                    scores[doc_id] = scores.get(doc_id, 0.0) + idf * (tf * (_K1 + 1)) / norm
        return sorted(scores.items(), key=lambda kv: -kv[1])


def _short(text: str) -> str:
    return text if len(text) <= _DESCRIPTION_LIMIT else text[: _DESCRIPTION_LIMIT - 3] + "..."


class _Catalog:
    def __init__(self, tools: list[dict[str, Any]]) -> None:
        self.tools: dict[str, dict[str, Any]] = {}
        for tool in tools:
            name = tool["name"]
            if name in META_TOOLS:
                raise ValueError(f"tool-search: catalog tool name {name!r} is reserved for a meta-tool")
            if name in self.tools and self.tools[name] != tool:
                raise ValueError(f"tool-search: duplicate catalog tool name {name!r}")
            self.tools[name] = tool
        self.index = BM25({n: f"{n} {t.get('description', '')}" for n, t in self.tools.items()})

    def search(self, query: str, options: SearchOptions) -> list[dict[str, Any]]:
        if not self.tools:
            return []
        hits = self.index.search(query)[: options.top_k * 2]
        terms = [t for t in _SPLIT.split(query.lower()) if len(t) > 1]
        boosted = []
        for name, score in hits:
            lower = name.lower()
            for term in terms:
                if lower == term:
                    score += 5
                elif term in lower:
                    score += 2
            boosted.append((name, score))
        boosted.sort(key=lambda kv: -kv[1])
        return [
            {
                "name": name,
                "description": _short(str(self.tools[name].get("description", ""))),
                "score": round(score * 100) / 100,
            }
            for name, score in boosted
            if score > options.min_score
        ][: options.top_k]

    def suggestions(self, name: str) -> list[str]:
        low = name.lower()
        return [n for n in self.tools if low in n.lower() or n.lower() in low][:3]


def _meta_tool_specs(auto_load: bool) -> list[dict[str, Any]]:
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


_INSTRUCTION = (
    "To discover available tools, call search_tools with a keyword query. "
    "To add one or more tools to the conversation, call load_tool with a toolName or toolNames array. "
    "Tools must be loaded before they can be used."
)
_INSTRUCTION_AUTO = (
    "To discover available tools, call search_tools with a keyword query. "
    "Matching tools are loaded automatically and become available on your next turn — "
    "there is no separate load step. After searching, use the tool directly."
)


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
            catalog = _Catalog(catalog_specs)
        except ValueError as exc:
            abort(str(exc))

        loaded: list[str] = list(state.get("loaded") or [])
        if options.storage == "in-memory" and thread_id:
            loaded += [n for n in self._thread_loaded(thread_id, options.ttl) if n not in loaded]
        if options.storage == "context":
            loaded += [n for n in _loaded_from_context(messages) if n not in loaded]

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
            _system("tool-search-instructions", _INSTRUCTION_AUTO if auto else _INSTRUCTION),
        ]
        if options.inject_catalog and catalog.tools:
            lines = [
                f"- `{n}`: {_short(str(t.get('description', '')))}" if t.get("description") else f"- `{n}`"
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
        step_tools = (
            _meta_tool_specs(auto) + always + [catalog.tools[n] for n in loaded if n in catalog.tools]
        )
        out: dict[str, Any] = {"system_messages": system, "tools": step_tools}
        if changed:
            out["messages"] = new_messages
        return out

    async def execute_tool(
        self, tool_name: str, args: Any, options: ToolSearchOptions, state: dict[str, Any], thread_id: str
    ) -> dict[str, Any]:
        """Run `search_tools` / `load_tool` (the orchestrator routes their calls here)."""
        specs = state.get("catalog")
        catalog = _Catalog(
            specs if isinstance(specs, list) else [t.model_dump(by_alias=True) for t in options.tools]
        )
        loaded: list[str] = list(state.get("loaded") or [])
        result = self._execute({"toolName": tool_name, "args": args}, catalog, options, loaded)
        state["loaded"] = loaded
        if options.storage == "in-memory" and thread_id:
            self._threads[thread_id] = (time.monotonic(), list(loaded))
        return result

    def _execute(
        self, inv: dict[str, Any], catalog: _Catalog, options: ToolSearchOptions, loaded: list[str]
    ) -> dict[str, Any]:
        raw = inv.get("args")
        args: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if inv.get("toolName") == "search_tools":
            return _search(str(args.get("query", "")), catalog, options.search, loaded)
        return _load(args, catalog, loaded)


def _system(msg_id: str, text: str) -> Message:
    return {
        "id": msg_id,
        "role": "system",
        "content": {"format": 2, "parts": [{"type": "text", "text": text}]},
    }


def _search(query: str, catalog: _Catalog, search: SearchOptions, loaded: list[str]) -> dict[str, Any]:
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


def _load(args: dict[str, Any], catalog: _Catalog, loaded: list[str]) -> dict[str, Any]:
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


def _loaded_from_context(messages: list[Message]) -> list[str]:
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
