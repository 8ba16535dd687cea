"""OrchestratorSettings: how `procmesh-orchestrator` serves (ports, keys, limits), from the environment.

What the agents are (sidecars, models, lanes) lives in the YAML config file; how the
process serves them lives here, so a deployment changes ports or keys without
touching the file. Every field reads ``PROCMESH_<FIELD>`` (``PROCMESH_HTTP_PORT``);
command-line flags override the environment.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class OrchestratorSettings(BaseSettings):
    """Serving settings of the orchestrator process (frozen; built once in ``main()``)."""

    model_config = SettingsConfigDict(env_prefix="PROCMESH_", frozen=True, use_attribute_docstrings=True)

    config_file: str | None = None
    """Path of the YAML configuration: ``PROCMESH_CONFIG_FILE`` or ``--config``. (Keys of the file
    itself are overridden by ``PROCMESH_CONFIG__<KEY>__...`` variables: a different mechanism, so a
    different name.)"""
    http_host: str = "127.0.0.1"
    """Interface of the HTTP API (``0.0.0.0`` to accept connections from other hosts)."""
    http_port: int = Field(default=4111, ge=0, le=65535)
    """Port of the HTTP API, /metrics and the probes (0: any free port, logged at start)."""
    grpc_host: str = "127.0.0.1"
    """Interface of the gRPC AgentService and grpc.health.v1."""
    grpc_port: int = Field(default=50050, ge=0, le=65535)
    """Port of the gRPC API (0: any free port, logged at start)."""
    grpc_socket: str | None = None
    """Also serve the gRPC API on this unix socket path (``/run/procmesh/orchestrator.sock``): the
    pod's sidecars reach the model gateway there (``PROCMESH_MODEL_GATEWAY=unix:///run/...``)
    without a TCP port. A stale socket file left by a crash is replaced."""
    tls_cert: str | None = None
    """PEM certificate (chain) of the HTTP and gRPC APIs; with ``tls_key`` both serve TLS only
    (HTTPS and a TLS gRPC port). The unix socket of ``grpc_socket`` stays plaintext: it never leaves
    the pod and its file mode guards it."""
    tls_key: str | None = None
    """PEM private key of ``tls_cert`` (the two go together)."""
    tls_client_ca: str | None = None
    """PEM CA bundle: with it, both APIs require a client certificate it signed (mTLS). Needs
    ``tls_cert``. Kubelet probes present no certificate: probe with an exec command then."""
    api_keys: Annotated[list[SecretStr], NoDecode] = []
    """Bearer keys accepted on /api/* and AgentService; empty: no authentication (development).
    ``PROCMESH_API_KEYS`` holds a comma-separated list or a JSON array of entries, each bound to a
    resource (``key=tenant-a``) or given a role (``key=@operator``, ``key=@gateway``); anything else
    is a start-up error naming the entry by its position."""
    max_request_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    """Largest request body (HTTP) or message (gRPC) accepted; larger ones get 413 / RESOURCE_EXHAUSTED."""
    drain_grace_seconds: float = Field(default=30.0, ge=0)
    """After SIGTERM: how long in-flight runs may take to finish before they are cancelled."""
    abort_on_disconnect: bool = True
    """A streamed run whose client leaves is aborted (its result keeps what was done, as
    ``RunStream.cancel``). False: it finishes in the background (memory saved) and only then
    frees its run slot."""
    trusted_context: dict[str, list[str]] = {}
    """Which callers may send which ``requestContext`` keys: a JSON object from a tenant's resource,
    ``@operator`` or ``*`` (every caller) to key names (``*``: every key). Keys that select a
    thread, a resource or a cache scope are reserved and never come from a caller; a key the caller
    is not trusted for is a 400 naming it. Empty: no caller sends request context."""
    untrusted_context: Literal["refuse", "drop"] = "refuse"
    """What an agent call (generate, stream; HTTP and gRPC) that sends request-context keys its
    caller is not trusted for, or its agent's ``requestContextSchema`` does not declare, gets:
    ``refuse``, a 400 / INVALID_ARGUMENT naming them; ``drop``, the
    run goes on without them, the response names them (``X-Procmesh-Dropped-Context``, over gRPC
    the initial metadata ``x-procmesh-dropped-context``), a WARNING log line names them and
    ``procmesh_request_context_dropped_total{agent}`` counts the call. Reserved keys are refused
    either way."""
    trust_request_context: bool = False
    """Deprecated: the same as ``PROCMESH_TRUSTED_CONTEXT={"*": ["*"]}`` (every caller may send
    every key that is not reserved); said so at start-up."""
    health_poll_seconds: float = Field(default=1.0, gt=0)
    """How often the sidecars' grpc.health.v1 status is polled for readiness."""
    config_poll_seconds: float = Field(default=2.0, ge=0)
    """How often the config file's content hash is read: a change reloads the config without a
    restart, as SIGHUP does (0: SIGHUP only). Kubernetes updates a mounted ConfigMap in place."""
    log_level: str = "INFO"
    """Logging level of the process."""
    allow_unauthenticated: bool = False
    """Serve without API keys on a non-loopback interface (``--allow-unauthenticated``). Without
    keys the service is open to anyone who reaches it, so by default it then binds loopback only."""
    allowed_hosts: Annotated[list[str], NoDecode] | None = None
    """``Host`` header values accepted (``*.example.com`` wildcards; ``*``: any). Default: any when
    API keys are set, else loopback names only, so a web page cannot drive a local instance
    through DNS rebinding. A comma-separated list in ``PROCMESH_ALLOWED_HOSTS``."""
    max_connections: int = Field(default=512, gt=0)
    """Open HTTP connections (and in-flight requests) served at once; past it: 503."""
    header_timeout_seconds: float = Field(default=10.0, gt=0)
    """A connection must send a complete request head within this, and is closed after being idle
    as long between requests (slow-loris connections do not pile up)."""
    body_timeout_seconds: float = Field(default=30.0, gt=0)
    """A request body must arrive within this; past it: 408."""
    max_input_messages: int = Field(default=10_000, gt=0)
    """Messages in one request."""
    max_input_depth: int = Field(default=24, ge=4, le=40)
    """Nesting levels of a request body (the envelope takes about four). At most 40: deeper input
    would exceed the sidecars' protobuf decoding limit."""
    max_input_string_chars: int = Field(default=1024 * 1024, gt=0)
    """Characters in one string of a request."""
    sse_heartbeat_seconds: float = Field(default=15.0, ge=0)
    """A streamed response sends a ``: ping`` comment line after this long without a chunk, so
    proxies with an idle timeout keep the connection (0: never)."""
    slow_client_seconds: float = Field(default=30.0, ge=0)
    """A client that leaves a response unread this long (the server's send buffer full the whole
    time) is cut and its run handled as a disconnect (``abort_on_disconnect``); until then its
    streamed run is paused, never buffered without bound (0: never cut)."""
    max_inflight_per_key: int | None = Field(default=None, gt=0)
    """Requests and streams in flight at once per API key, HTTP and gRPC together; past it: 429 /
    RESOURCE_EXHAUSTED naming this limit. Default: a quarter of ``max_connections``, so one key
    cannot take every connection from the others. Without API keys (development) only
    ``max_connections`` applies, and setting this is an error (it would limit nothing)."""

    @property
    def inflight_per_key(self) -> int:
        """`max_inflight_per_key`, or its default from `max_connections`."""
        return self.max_inflight_per_key or max(1, self.max_connections // 4)

    @model_validator(mode="after")
    def _tls_pair(self) -> OrchestratorSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together (PROCMESH_TLS_CERT, PROCMESH_TLS_KEY)")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca (mTLS) needs tls_cert and tls_key: the APIs must serve TLS first")
        return self

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [host.strip() for host in value.split(",") if host.strip()]
        return value

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            # Empty entries are kept: the key list refuses them by position (`_auth.parse_keys`),
            # as it refuses an entry holding whitespace or ';' (two keys that were meant as two).
            return [key.strip() for key in text.split(",")] if text else []
        return value
