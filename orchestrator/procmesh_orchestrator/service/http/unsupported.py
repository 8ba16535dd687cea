"""The routes of the client's catalog APIs that procmesh answers with 501: each names the feature
and why (`UNSUPPORTED`, the table docs/service.md shows), never a 404. They go last in the route
table, so a route another part of the API serves takes precedence."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from procmesh_orchestrator.service._errors import NotSupportedError
from procmesh_orchestrator.service.api.core import ServiceCore

WORKFLOW_RUNS = (
    "procmesh runs a processor workflow in an agent's lanes or through getProcessor(id).execute(), "
    "never as a workflow run"
)
_VOICE = "procmesh agents have no voice provider"
_MODEL = "an agent's model is fixed by the configuration (change it there and roll out)"
_NETWORK = "procmesh agents have no sub-agents to route between"
_SIGNALS = "procmesh runs are request-scoped: there is no long-lived agent thread to message"
_LEGACY = "procmesh serves the current routes only (use /generate and /stream)"
_EDITOR = "procmesh agents are configured in files, not edited at runtime"
_RECOVER = "a durable run is taken over by another replica by itself; reattach with observe"
_RESUME = "decide a suspended tool call with approveToolCall or declineToolCall"
_PROVIDERS = "procmesh tools and processors come from sidecars and MCP servers in the configuration"
_OBSERVATIONAL = (
    "procmesh memory keeps message history, working memory and semantic recall; "
    "no observer model compresses threads into observations"
)
_TRANSFER = "a thread belongs to one resource for its whole life (thread ids are scoped by resource)"

UNSUPPORTED: tuple[tuple[str, str, str, str], ...] = (
    ("POST", "/agents/{agent_id}/generate-legacy", "the legacy generate route", _LEGACY),
    ("POST", "/agents/{agent_id}/stream-legacy", "the legacy stream route", _LEGACY),
    ("POST", "/agents/{agent_id}/generate/vnext", "the vNext generate route", _LEGACY),
    ("POST", "/agents/{agent_id}/stream/vnext", "the vNext stream route", _LEGACY),
    ("POST", "/agents/{agent_id}/streamVNext", "the vNext stream route", _LEGACY),
    ("POST", "/agents/{agent_id}/stream/ui", "AI SDK UI message streams", _LEGACY),
    ("POST", "/agents/{agent_id}/stream/vnext/ui", "AI SDK UI message streams", _LEGACY),
    ("POST", "/agents/{agent_id}/network", "agent networks", _NETWORK),
    ("POST", "/agents/{agent_id}/approve-network-tool-call", "agent networks", _NETWORK),
    ("POST", "/agents/{agent_id}/decline-network-tool-call", "agent networks", _NETWORK),
    ("POST", "/agents/{agent_id}/send-message", "agent messages", _SIGNALS),
    ("POST", "/agents/{agent_id}/queue-message", "agent messages", _SIGNALS),
    ("POST", "/agents/{agent_id}/signals", "agent signals", _SIGNALS),
    ("POST", "/agents/{agent_id}/threads/subscribe", "thread subscriptions", _SIGNALS),
    ("POST", "/agents/{agent_id}/threads/abort", "aborting a thread's run", _SIGNALS),
    ("POST", "/agents/{agent_id}/stream-until-idle", "streaming until a thread is idle", _SIGNALS),
    ("POST", "/agents/{agent_id}/resume-stream-until-idle", "streaming until a thread is idle", _SIGNALS),
    ("POST", "/agents/{agent_id}/recover", "recovering a run", _RECOVER),
    ("POST", "/agents/{agent_id}/send-tool-approval", "tool approval by message", _RESUME),
    ("POST", "/agents/{agent_id}/model", "changing an agent's model", _MODEL),
    ("POST", "/agents/{agent_id}/model/reset", "changing an agent's model", _MODEL),
    ("POST", "/agents/{agent_id}/models/reorder", "model lists", _MODEL),
    ("POST", "/agents/{agent_id}/models/{model_config_id}", "model lists", _MODEL),
    ("POST", "/agents/{agent_id}/clone", "cloning an agent", _EDITOR),
    # the Agent resource's version methods (listVersions, ...) call the stored-agents routes
    ("GET", "/stored/agents/{agent_id}/versions", "agent versions", _EDITOR),
    ("POST", "/stored/agents/{agent_id}/versions", "agent versions", _EDITOR),
    ("GET", "/stored/agents/{agent_id}/versions/compare", "agent versions", _EDITOR),
    ("GET", "/stored/agents/{agent_id}/versions/{version_id}", "agent versions", _EDITOR),
    ("DELETE", "/stored/agents/{agent_id}/versions/{version_id}", "agent versions", _EDITOR),
    ("POST", "/stored/agents/{agent_id}/versions/{version_id}/activate", "agent versions", _EDITOR),
    ("POST", "/stored/agents/{agent_id}/versions/{version_id}/restore", "agent versions", _EDITOR),
    ("POST", "/agents/{agent_id}/instructions/enhance", "enhancing instructions", _EDITOR),
    ("GET", "/agents/{agent_id}/plans/file", "agent plans", "procmesh agents have no workspace"),
    ("GET", "/agents/{agent_id}/skills/{skill_name}", "agent skills", "procmesh agents have no workspace"),
    ("GET", "/agents/{agent_id}/browser/session", "browser sessions", "procmesh agents have no browser"),
    ("POST", "/agents/{agent_id}/browser/close", "browser sessions", "procmesh agents have no browser"),
    ("POST", "/agents/{agent_id}/voice/speak", "voice", _VOICE),
    ("POST", "/agents/{agent_id}/voice/listen", "voice", _VOICE),
    ("GET", "/agents/{agent_id}/voice/speakers", "voice", _VOICE),
    ("GET", "/agents/{agent_id}/voice/listener", "voice", _VOICE),
    ("POST", "/agents/{agent_id}/speak", "voice", _VOICE),
    ("POST", "/agents/{agent_id}/listen", "voice", _VOICE),
    ("GET", "/agents/{agent_id}/speakers", "voice", _VOICE),
    ("POST", "/workflows/events", "workflow events", WORKFLOW_RUNS),
    ("GET", "/workflows/{workflow_id}/runs", "workflow runs", WORKFLOW_RUNS),
    ("GET", "/workflows/{workflow_id}/runs/{run_id}", "workflow runs", WORKFLOW_RUNS),
    ("DELETE", "/workflows/{workflow_id}/runs/{run_id}", "workflow runs", WORKFLOW_RUNS),
    ("POST", "/workflows/{workflow_id}/runs/{run_id}/cancel", "workflow runs", WORKFLOW_RUNS),
    ("POST", "/workflows/{workflow_id}/runs/{run_id}/steps/execute", "workflow runs", WORKFLOW_RUNS),
    *(
        ("POST", f"/workflows/{{workflow_id}}/{action}", "workflow runs", WORKFLOW_RUNS)
        for action in (
            "create-run",
            "start",
            "start-async",
            "stream",
            "stream-legacy",
            "observe",
            "observe-stream-legacy",
            "resume",
            "resume-async",
            "resume-stream",
            "resume-no-wait",
            "restart",
            "restart-async",
            "restart-all-active-workflow-runs",
            "restart-all-active-workflow-runs-async",
            "time-travel",
            "time-travel-async",
            "time-travel-stream",
        )
    ),
    ("GET", "/memory/observational-memory", "observational memory", _OBSERVATIONAL),
    ("POST", "/memory/observational-memory/buffer-status", "observational memory", _OBSERVATIONAL),
    ("POST", "/memory/threads/{thread_id}/transfer", "thread transfer", _TRANSFER),
    *(
        (method, f"/memory/network{path}", "agent networks", _NETWORK)
        for method, path in (
            ("GET", "/status"),
            ("GET", "/threads"),
            ("POST", "/threads"),
            ("GET", "/threads/{thread_id}"),
            ("PATCH", "/threads/{thread_id}"),
            ("DELETE", "/threads/{thread_id}"),
            ("GET", "/threads/{thread_id}/messages"),
            ("POST", "/save-messages"),
            ("POST", "/messages/delete"),
        )
    ),
    ("GET", "/processor-providers", "processor providers", _PROVIDERS),
    ("GET", "/processor-providers/{provider_id}", "processor providers", _PROVIDERS),
    ("GET", "/tool-providers", "tool providers", _PROVIDERS),
    *(
        ("GET", f"/tool-providers/{{provider_id}}/{rest}", "tool providers", _PROVIDERS)
        for rest in (
            "toolkits",
            "tools",
            "tools/{tool_slug}/schema",
            "health",
            "connection-fields",
            "connections",
            "connections/{connection_id}/usage",
            "auth-status/{auth_id}",
        )
    ),
    ("POST", "/tool-providers/{provider_id}/authorize", "tool providers", _PROVIDERS),
    ("POST", "/tool-providers/{provider_id}/connection-status", "tool providers", _PROVIDERS),
    ("PATCH", "/tool-providers/{provider_id}/connections/{connection_id}", "tool providers", _PROVIDERS),
    ("DELETE", "/tool-providers/{provider_id}/connections/{connection_id}", "tool providers", _PROVIDERS),
)
"""(method, path under /api, feature, why) of every route of the client's agent, tool, processor,
workflow-listing, model-provider and memory APIs that procmesh answers with 501."""


def not_supported(service: ServiceCore, feature: str, why: str) -> Callable[[Request], Awaitable[Response]]:
    async def not_supported(request: Request) -> Response:
        agent_id = request.path_params.get("agent_id")
        if agent_id is not None:
            service.agent(agent_id)  # an unknown agent is still a 404, as everywhere
        raise NotSupportedError(f"{feature} is not supported by procmesh: {why}")

    return not_supported


_NO_STORE = "procmesh stores no {} to query"
UNSUPPORTED_APIS: tuple[tuple[str, str, str], ...] = (
    ("/logs", "logs", "procmesh writes its logs to stderr (PROCMESH_LOG_FORMAT=json for a collector)"),
    ("/observability", "traces", "procmesh exports its traces over OTLP and its metrics on /metrics"),
    ("/scores", "scorers", "procmesh runs no scorers: judge answers with output processors"),
    ("/datasets", "datasets", "procmesh runs no evaluations"),
    ("/experiments", "experiments", "procmesh runs no evaluations"),
    ("/a2a", "the A2A protocol", "procmesh agents answer over its HTTP and gRPC APIs"),
    ("/.well-known", "A2A agent cards", "procmesh agents answer over its HTTP and gRPC APIs"),
    ("/v1", "the OpenAI Responses API", _LEGACY),
    ("/stored", "stored agents, prompts, scorers and MCP clients", _EDITOR),
    ("/editor", "the editor", _EDITOR),
    ("/agent-builder", "the agent builder", _EDITOR),
    ("/agent-controller", "the agent controller", _SIGNALS),
    (
        "/background-tasks",
        "background tasks",
        "background tool calls are process-local and not listed: each result lands in its thread, "
        "and background-work-signals tells the caller",
    ),
    ("/schedules", "schedules", "procmesh runs on request: schedule calls from outside (a CronJob)"),
    ("/channels", "channels", "procmesh agents answer over its HTTP and gRPC APIs"),
    ("/workspaces", "workspaces", "procmesh agents have no workspace"),
    ("/auth", "auth providers", "procmesh authenticates API keys (PROCMESH_API_KEYS)"),
    ("/vector", "vector stores", "procmesh exposes no vector store over its API"),
    ("/vectors", "vector stores", "procmesh exposes no vector store over its API"),
    ("/embedders", "embedders", "procmesh exposes no embedder over its API"),
    ("/system", "system information", "GET /readyz and /metrics say what this orchestrator serves"),
)
"""(path under /api, feature, why) of every other API of the client that procmesh does not serve:
each route under it answers 501 (after every route served, `UNSUPPORTED` included)."""

_ANY = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def unsupported_routes(service: ServiceCore) -> list[Route]:
    """A 501 naming the feature for each `UNSUPPORTED` route, then for every route of the
    `UNSUPPORTED_APIS`; they go last in the route table."""
    return [
        *(
            Route(f"/api{path}", not_supported(service, feature, why), methods=[method])
            for method, path, feature, why in UNSUPPORTED
        ),
        *(
            Route(f"/api{prefix}{rest}", not_supported(service, feature, why), methods=_ANY)
            for prefix, feature, why in UNSUPPORTED_APIS
            for rest in ("", "/{rest:path}")
        ),
    ]
