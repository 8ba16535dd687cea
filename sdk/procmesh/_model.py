"""The `model` hook argument: the orchestrator's models, reached through its model gateway.

A hook that declares ``model`` gets a `Models`; ``await model("openai/gpt-5-nano").generate(
messages, schema=...)`` calls ``procmesh.v1.ModelService.Generate`` on the orchestrator, which
holds the provider keys, calls the model and (with a schema) parses and validates its JSON
answer. The sidecar holds no provider key: only the gateway's address
(``PROCMESH_MODEL_GATEWAY``: the orchestrator's ``unix:///path.sock``, where no key is needed, or
its ``host:port``) and, over TCP when the orchestrator has API keys, a key with the ``gateway``
role (``PROCMESH_MODEL_GATEWAY_KEY``), sent as ``authorization: Bearer``.

Each call carries the hook's remaining deadline (the orchestrator's deadline of the hook call;
30 s where there is none, e.g. in the output stream) and the trace context of the hook's span.
A gateway error is a `ModelError` (an `InternalError`): a hook that lets it escape fails its
call, and the processor's failure policy in the orchestrator decides what the run does.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import os
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import struct_pb2

from procmesh import convert, tracing
from procmesh._model_batch import GatewayStatus, batches
from procmesh.errors import InternalError, error_for_status
from procmesh.v1 import model_pb2 as mpb
from procmesh.v1 import model_pb2_grpc as mgrpc

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
"""Seconds a gateway call may take when the hook has no deadline (and none is given)."""

hook_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "procmesh_hook_deadline", default=None
)
"""The running hook call's deadline (``time.monotonic()``), set by the servicer around each call;
it reaches the processor's hook loop with the call's context."""

hook_span: contextvars.ContextVar[tracing.Span | None] = contextvars.ContextVar(
    "procmesh_hook_span", default=None
)
"""The sidecar's span of the running hook call (an output-stream session's for its parts), set
by the servicer as `hook_deadline` is: `Model.report_saved` counts on it."""


class ModelError(InternalError):
    """The model gateway refused or failed a call; `status` is the gateway's gRPC status code."""

    def __init__(self, message: str, status: grpc.StatusCode = grpc.StatusCode.UNKNOWN) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ModelResult:
    """A model's answer through the gateway."""

    text: str
    """The answer's text (with a schema: the JSON text that was accepted)."""
    object: Any = None
    """The parsed answer when a schema was given (it matches the schema), else None."""
    usage: dict[str, int] = field(default_factory=dict)
    """``inputTokens``, ``outputTokens``, ``totalTokens`` over every attempt."""
    finish_reason: str = ""
    """Why the model stopped (``stop``, ``length``, ...)."""
    model: str = ""
    """The model that answered."""
    attempts: int = 1
    """Model calls made (2 when the first answer did not match the schema)."""


@dataclass(frozen=True)
class JudgeSection:
    """A typed verdict the gateway may judge in one call with other guards' (``section=`` of
    `Model.generate`): calls about the same `content` with the same model, run and `phase` become
    one model call with a section per guard; each call still gets only its own answer."""

    content: str
    """The text judged."""
    instructions: str
    """The guard's instructions to the judge (its system prompt when judged alone)."""
    question: str
    """What it asks about the content (its prompt without the content)."""
    phase: str = "input"
    """``input`` (a message) or ``output`` (a window of the streamed answer)."""


@dataclass(frozen=True)
class GatewayConfig:
    """Where the model gateway is and the API key to present."""

    address: str
    key: str | None = None
    tls: GatewayTls | None = None
    """TLS to the orchestrator's gRPC port (None: plaintext, as on its unix socket)."""


@dataclass(frozen=True)
class GatewayTls:
    """The CA that verifies the orchestrator's TLS port, and a client pair when it requires mTLS."""

    ca: str
    cert: str | None = None
    key: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel's credentials, the PEM files read now (a missing file: `ModelError`)."""
        try:
            read = {name: Path(path).read_bytes() if path else None for name, path in vars(self).items()}
        except OSError as exc:
            raise ModelError(
                f"model gateway TLS: cannot read {exc.filename}: {exc.strerror}",
                grpc.StatusCode.FAILED_PRECONDITION,
            ) from None
        return grpc.ssl_channel_credentials(read["ca"], read["key"], read["cert"])


_config: GatewayConfig | None = None


def configure(address: str | None, key: str | None = None, tls: GatewayTls | None = None) -> None:
    """Use the gateway at `address` (``run()``/``serve()`` call this from the sidecar's settings)."""
    global _config
    _config = GatewayConfig(address, key or None, tls) if address else None


def _tls_from_environment() -> GatewayTls | None:
    ca = os.environ.get("PROCMESH_MODEL_GATEWAY_CA") or None
    cert = os.environ.get("PROCMESH_MODEL_GATEWAY_CERT") or None
    key = os.environ.get("PROCMESH_MODEL_GATEWAY_CERT_KEY") or None
    return gateway_tls(ca, cert, key)


def gateway_tls(ca: str | None, cert: str | None, key: str | None) -> GatewayTls | None:
    """The gateway link's TLS from its three settings (a client pair without a CA is refused)."""
    if ca is None:
        if cert or key:
            raise ValueError(
                "PROCMESH_MODEL_GATEWAY_CERT/_CERT_KEY need PROCMESH_MODEL_GATEWAY_CA (the client "
                "certificate is for the orchestrator's TLS port)"
            )
        return None
    if (cert is None) != (key is None):
        raise ValueError("PROCMESH_MODEL_GATEWAY_CERT and PROCMESH_MODEL_GATEWAY_CERT_KEY go together")
    return GatewayTls(ca, cert, key)


def _current_config() -> GatewayConfig:
    if _config is not None:
        return _config
    # A ProcessorServer started without run(): the same variables the settings read.
    address = os.environ.get("PROCMESH_MODEL_GATEWAY", "").strip()
    if not address:
        raise ModelError(
            "no model gateway: set PROCMESH_MODEL_GATEWAY (or --model-gateway) to the orchestrator's "
            "gRPC address, host:port or unix:///path.sock",
            grpc.StatusCode.FAILED_PRECONDITION,
        )
    try:
        tls = _tls_from_environment()
    except ValueError as exc:
        raise ModelError(str(exc), grpc.StatusCode.FAILED_PRECONDITION) from None
    return GatewayConfig(address, os.environ.get("PROCMESH_MODEL_GATEWAY_KEY") or None, tls)


# grpc.aio channels belong to one event loop, and each processor's hooks run on a loop of its own.
_channels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[GatewayConfig, Any]] = (
    weakref.WeakKeyDictionary()
)
"""Per loop: the gateway config and the stub on its channel (made once: a stub builds a callable
per method, 12 us a question when made per call)."""


def _stub(config: GatewayConfig) -> Any:  # the generated stub types its calls as sync: Any, as _client does
    loop = asyncio.get_running_loop()
    cached = _channels.get(loop)
    if cached is None or cached[0] != config:
        channel = (  # gRPC reads unix:///path itself
            grpc.aio.secure_channel(config.address, config.tls.credentials())
            if config.tls is not None
            else grpc.aio.insecure_channel(config.address)
        )
        cached = (config, mgrpc.ModelServiceStub(channel))
        _channels[loop] = cached
    return cached[1]


Messages = str | Sequence[Mapping[str, Any]]
"""A prompt: one user message's text, or messages ``{"role", "content"}`` (text, or text parts)."""


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content", message.get("text", ""))
    if isinstance(content, str):
        return content
    parts = content.get("parts", []) if isinstance(content, Mapping) else content
    return "".join(
        str(p.get("text", "")) for p in parts if isinstance(p, Mapping) and p.get("type", "text") == "text"
    )


def _messages(messages: Messages) -> list[mpb.ModelMessage]:
    if isinstance(messages, str):
        return [mpb.ModelMessage(role="user", text=messages)]
    return [mpb.ModelMessage(role=str(m.get("role", "user")), text=_text(m)) for m in messages]


def _schema_struct(schema: Mapping[str, Any]) -> struct_pb2.Struct:
    """`schema` as the request's Struct.

    A hook asks its every question with one of a few schemas, rebuilt per question (a guard's
    depends on its options), and building the Struct cost 0.1 ms a question, more than the rest
    of the request: 1.9 ms of an input guard's 19 questions. Its JSON text (a few microseconds)
    finds the Struct built before; a schema that is not JSON text is built each time.
    """
    try:
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return convert.to_struct(dict(schema))
    return _struct_of(text)


@functools.lru_cache(maxsize=256)
def _struct_of(schema_json: str) -> struct_pb2.Struct:
    """The Struct of a schema's JSON text (callers copy it: never changed)."""
    return convert.to_struct(json.loads(schema_json))


class Model:
    """One model of the orchestrator's, as a hook calls it (``model(ref)``)."""

    def __init__(self, ref: str, processor_id: str, run_id: str) -> None:
        self.ref = ref
        self._processor_id = processor_id
        self._run_id = run_id

    async def generate(
        self,
        messages: Messages,
        *,
        schema: Mapping[str, Any] | None = None,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
        timeout: float | None = None,
        section: JudgeSection | None = None,
    ) -> ModelResult:
        """Ask the model; with `schema` (a JSON schema) the answer's parsed value is `object`.

        Args:
            messages: One user message's text, or ``{"role", "content"}`` messages (roles
                ``system``, ``user``, ``assistant``).
            schema: A JSON schema the answer must match (the gateway retries once, then fails).
            temperature: Sampling temperature (None: the provider's default).
            max_output_tokens: Upper bound on the answer's tokens.
            timeout: Seconds (None: the hook's remaining deadline, else 30 s); capped by the
                hook's deadline.
            section: With `schema`, lets the gateway merge this question with other guards'
                about the same content into one judge call (`messages` is the prompt used when
                nothing merges); the answer is this call's own section either way.

        Raises:
            ModelError: The gateway refused the call or the model failed (an `InternalError`).
        """
        config = _current_config()
        request = mpb.ModelServiceGenerateRequest(
            model=self.ref,
            messages=_messages(messages),
            processor_id=self._processor_id,
            run_id=self._run_id,
        )
        if schema is not None:
            request.schema.CopyFrom(_schema_struct(schema))
        if temperature is not None:
            request.temperature = temperature
        if max_output_tokens is not None:
            request.max_output_tokens = max_output_tokens
        if section is not None:
            request.section.CopyFrom(
                mpb.JudgeSection(
                    content=section.content,
                    instructions=section.instructions,
                    question=section.question,
                    phase=section.phase,
                )
            )
        deadline = hook_deadline.get()
        left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
        bounds = [t for t in (timeout, left) if t is not None]
        bound = min(bounds) if bounds else DEFAULT_TIMEOUT
        metadata: list[tuple[str, str | bytes]] = list(tracing.metadata())
        if not metadata and (span := hook_span.get()) is not None:
            metadata = list(span.metadata())  # an output-stream session's span: not current around parts
        if config.key:
            metadata.append(("authorization", f"Bearer {config.key}"))
        try:  # calls made at once go in one GenerateBatch (`_model_batch`)
            response = await batches().generate(_stub(config), config, request, bound, tuple(metadata))
        except GatewayStatus as exc:
            err = error_for_status(exc.code, exc.details)
            message = f"model gateway: {self.ref!r} failed with {err.code.name}: {err}"
            raise ModelError(message, err.code) from None
        usage = {
            "inputTokens": response.usage.input_tokens,
            "outputTokens": response.usage.output_tokens,
            "totalTokens": response.usage.total_tokens,
        }
        return ModelResult(
            text=response.text,
            object=convert.from_value(response.object) if response.HasField("object") else None,
            usage=usage,
            finish_reason=response.finish_reason,
            model=response.model,
            attempts=response.attempts,
        )

    def report_saved(self, count: int = 1) -> None:
        """Tell the gateway this processor settled `count` questions for this model without asking
        it (a cheap pre-check): the orchestrator counts them as judge calls saved, ``by="precheck"``.

        Returns at once and never raises: the report goes in the background, reports made while
        one is on its way go together in the next, and one the gateway refuses (or no gateway is
        configured) is logged at DEBUG and dropped: a count must never fail or slow a hook. The
        hook's span counts them too (``procmesh.judge.precheck_saved``), so the run's trace shows
        which processor settled how many questions itself.
        """
        span = hook_span.get()
        if span is not None and count >= 1:
            span.add("procmesh.judge.precheck_saved", count)
        try:
            config = _current_config()
        except ModelError:
            return  # no gateway: nothing asks the judge, nothing to count
        if count >= 1:
            _saved_reports().add(config, self._processor_id, self._run_id, count)


class _SavedReports:
    """The reports of one event loop not sent yet, by (processor, run), and the task sending them."""

    def __init__(self) -> None:
        self.pending: dict[tuple[GatewayConfig, str, str], int] = {}
        self.sending: asyncio.Task[None] | None = None

    def add(self, config: GatewayConfig, processor_id: str, run_id: str, count: int) -> None:
        key = (config, processor_id, run_id)
        self.pending[key] = self.pending.get(key, 0) + count
        if self.sending is None or self.sending.done():
            self.sending = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        while self.pending:
            batch, self.pending = self.pending, {}
            for (config, processor_id, run_id), count in batch.items():
                request = mpb.ModelServiceReportSavedRequest(
                    processor_id=processor_id, run_id=run_id, count=count
                )
                metadata = (("authorization", f"Bearer {config.key}"),) if config.key else ()
                try:
                    await _stub(config).ReportSaved(request, timeout=DEFAULT_TIMEOUT, metadata=metadata)
                except (grpc.aio.AioRpcError, ModelError) as exc:
                    log.debug("model gateway: a report of %d judge calls saved was dropped: %s", count, exc)


_reports: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _SavedReports] = weakref.WeakKeyDictionary()


def _saved_reports() -> _SavedReports:
    loop = asyncio.get_running_loop()
    reports = _reports.get(loop)
    if reports is None:
        reports = _reports[loop] = _SavedReports()
    return reports


class Models:
    """The ``model`` hook argument: ``model(ref)`` is the orchestrator's model `ref` (a ``models``
    key of its config or ``provider/model-id``)."""

    def __init__(self, processor_id: str, run_id: str) -> None:
        self._processor_id = processor_id
        self._run_id = run_id

    def __call__(self, ref: str) -> Model:
        """The model `ref` names, called through the gateway."""
        return Model(ref, self._processor_id, self._run_id)
