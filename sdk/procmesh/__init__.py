"""procmesh: write LLM-agent processors in Python and serve them as gRPC sidecars.

Subclass `Processor`, implement any of the seeds' hooks in snake_case, and
serve it with `run([MyProcessor()])` (or `ProcessorServer` in your own loop). Subclass `Tool`
to host a standalone tool an agent config names: `run([...], tools=[MyTool()])`.

The names below load on first use (PEP 562): `import procmesh.tracing`, ``from procmesh import
RUN_ID`` or `procmesh.parts` brings in neither grpc nor protobuf, so code that only traces, logs or
reads message parts (the orchestrator's run loop) stays free of the wire. `_EXPORTS` says where
each name lives; the `TYPE_CHECKING` block repeats it for type checkers
(tests/unit/sdk/test_exports.py keeps the two equal).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procmesh import check, convert, errors, hooks, parts
    from procmesh._client import ProcessorClient
    from procmesh._logging import RUN_ID, TRACE_ID, JsonFormatter, configure_logging
    from procmesh._message_list import MessageList
    from procmesh._model import JudgeSection, ModelError
    from procmesh._processor import HOOK_NAMES, Processor, TripWire, Writer
    from procmesh._run import ProcessorSettings, run, serve, settings_from_args, settings_parser
    from procmesh._server import SERVICE_NAME, ProcessorServer, channel_credentials, server_credentials
    from procmesh._tool import Tool, ToolContext
    from procmesh._version import __version__
    from procmesh.errors import translate_rpc_error

__all__ = [
    "HOOK_NAMES",
    "RUN_ID",
    "SERVICE_NAME",
    "TRACE_ID",
    "JsonFormatter",
    "JudgeSection",
    "MessageList",
    "ModelError",
    "Processor",
    "ProcessorClient",
    "ProcessorServer",
    "ProcessorSettings",
    "Tool",
    "ToolContext",
    "TripWire",
    "Writer",
    "__version__",
    "channel_credentials",
    "check",
    "configure_logging",
    "convert",
    "errors",
    "hooks",
    "parts",
    "run",
    "serve",
    "server_credentials",
    "settings_from_args",
    "settings_parser",
    "translate_rpc_error",
]

_EXPORTS = {
    "HOOK_NAMES": "procmesh._processor",
    "RUN_ID": "procmesh._logging",
    "SERVICE_NAME": "procmesh._server",
    "TRACE_ID": "procmesh._logging",
    "JsonFormatter": "procmesh._logging",
    "JudgeSection": "procmesh._model",
    "MessageList": "procmesh._message_list",
    "ModelError": "procmesh._model",
    "Processor": "procmesh._processor",
    "ProcessorClient": "procmesh._client",
    "ProcessorServer": "procmesh._server",
    "ProcessorSettings": "procmesh._run",
    "Tool": "procmesh._tool",
    "ToolContext": "procmesh._tool",
    "TripWire": "procmesh._processor",
    "Writer": "procmesh._processor",
    "__version__": "procmesh._version",
    "channel_credentials": "procmesh._server",
    "check": "procmesh",
    "configure_logging": "procmesh._logging",
    "convert": "procmesh",
    "errors": "procmesh",
    "hooks": "procmesh",
    "parts": "procmesh",
    "run": "procmesh._run",
    "serve": "procmesh._run",
    "server_credentials": "procmesh._server",
    "settings_from_args": "procmesh._run",
    "settings_parser": "procmesh._run",
    "translate_rpc_error": "procmesh.errors",
}
"""Where each public name lives (``procmesh``: the name is a submodule)."""


def __getattr__(name: str) -> Any:
    """A public name, imported from its module the first time it is asked for (then kept)."""
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'procmesh' has no attribute {name!r}")
    if where == __name__:
        value: Any = importlib.import_module(f"{__name__}.{name}")
    else:
        value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
