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

from procmesh_sidecars.builtins.tool_search._index import BM25, META_TOOLS, tokenize
from procmesh_sidecars.builtins.tool_search._meta import ACTIVATION_TYPE
from procmesh_sidecars.builtins.tool_search._options import SearchOptions, ToolSearchOptions, ToolSpecModel
from procmesh_sidecars.builtins.tool_search._processor import ToolSearch

__all__ = [
    "ACTIVATION_TYPE",
    "BM25",
    "META_TOOLS",
    "SearchOptions",
    "ToolSearch",
    "ToolSearchOptions",
    "ToolSpecModel",
    "tokenize",
]
