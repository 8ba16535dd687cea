"""procmesh: write LLM-agent processors in Python and serve them as gRPC sidecars.

Subclass `Processor`, implement any of the seeds' hooks in snake_case, and
serve it with `run([MyProcessor()])` (or `ProcessorServer` in your own loop). Subclass `Tool`
to host a standalone tool an agent config names: `run([...], tools=[MyTool()])`.
"""

from procmesh import check, convert, errors, hooks
from procmesh._client import ProcessorClient, translate_rpc_error
from procmesh._logging import RUN_ID, TRACE_ID, JsonFormatter, configure_logging
from procmesh._message_list import MessageList
from procmesh._processor import HOOK_NAMES, Processor, TripWire, Writer
from procmesh._run import ProcessorSettings, run, serve, settings_from_args, settings_parser
from procmesh._server import SERVICE_NAME, ProcessorServer, channel_credentials, server_credentials
from procmesh._tool import Tool, ToolContext
from procmesh._version import __version__

__all__ = [
    "HOOK_NAMES",
    "RUN_ID",
    "SERVICE_NAME",
    "TRACE_ID",
    "JsonFormatter",
    "MessageList",
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
    "run",
    "serve",
    "server_credentials",
    "settings_from_args",
    "settings_parser",
    "translate_rpc_error",
]
