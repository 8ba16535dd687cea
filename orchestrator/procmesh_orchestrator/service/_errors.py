"""The service's errors: one root under OrchestratorError, each class binds its HTTP status and gRPC code."""

from __future__ import annotations

import logging
from typing import ClassVar

import grpc

from procmesh_orchestrator.errors import (
    InvalidMemoryInputError,
    MemoryStoreError,
    OrchestratorError,
    ResumeConflictError,
    StoreUnavailableError,
    SuspendedRunNotFoundError,
)
from procmesh_orchestrator.store import about_the_request, client_message

log = logging.getLogger(__name__)


class ServiceError(OrchestratorError):
    """A request the service refuses; `http_status` and `grpc_code` say how each API reports it."""

    http_status: ClassVar[int] = 500
    grpc_code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL


class BadRequestError(ServiceError):
    """The body or message is malformed or fails validation."""

    http_status = 400
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class AuthenticationError(ServiceError):
    """No API key, or an unknown one."""

    http_status = 401
    grpc_code = grpc.StatusCode.UNAUTHENTICATED


class CatalogNotFoundError(ServiceError):
    """No such tool, processor or workflow (the catalog API)."""

    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND


class ForbiddenError(ServiceError):
    """The caller may not do this on this server (the message names the setting that allows it)."""

    http_status = 403
    grpc_code = grpc.StatusCode.PERMISSION_DENIED


class NotSupportedError(ServiceError):
    """A feature of the reference's API that procmesh does not support (the message says why)."""

    http_status = 501
    grpc_code = grpc.StatusCode.UNIMPLEMENTED


class AgentNotFoundError(ServiceError):
    """No agent has this id."""

    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND


class RequestTimeoutError(ServiceError):
    """The request body did not arrive within ``body_timeout_seconds``."""

    http_status = 408
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED


class UnsupportedMediaTypeError(ServiceError):
    """The body is not declared as JSON (``Content-Type: application/json``)."""

    http_status = 415
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class ClientGoneError(ServiceError):
    """The client closed the connection before its request arrived (counted as 499, not a 5xx)."""

    http_status = 499
    grpc_code = grpc.StatusCode.CANCELLED


class TooLargeError(ServiceError):
    """The request is larger than ``max_request_bytes``."""

    http_status = 413
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class TooManyRequestsError(ServiceError):
    """The caller's API key has as many requests in flight as it may (the message names the limit)."""

    http_status = 429
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DrainingError(ServiceError):
    """The server is shutting down and takes no new runs."""

    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE


class SuspendedRunGoneError(ServiceError):
    """No run waits for this tool call here (none by this id, or not the caller's resource)."""

    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND


class RunNotActiveError(ServiceError):
    """No run by this id is streaming on this replica (cancel)."""

    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND


class DurableRunGoneError(ServiceError):
    """No durable run by this id for this caller (none, another resource's, another agent's), or
    its events are no longer kept (the log's retention passed)."""

    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND


class DecisionRecordGoneError(ServiceError):
    """No decision record of this run for this caller (none kept, or another resource's run)."""

    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND


class ReplayJobGoneError(ServiceError):
    """No replay job of this id in this process (none started, or the process restarted)."""

    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND


class DurableUnavailableError(ServiceError):
    """The store or the event log of durable runs cannot be reached now; retrying later may work."""

    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE


class ResumeRefusedError(ServiceError):
    """The tool call was already decided, or is being resumed (here or on another replica)."""

    http_status = 409
    grpc_code = grpc.StatusCode.ABORTED


class ResumeAnswerError(ResumeRefusedError):
    """The suspended call awaits another kind of answer (data, not an approval, or the reverse);
    the run stays suspended."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION


class RunIdInUseError(ServiceError):
    """The caller chose a run id another run has (running here, suspended or durable)."""

    http_status = 409
    grpc_code = grpc.StatusCode.ALREADY_EXISTS


class StoreDownError(ServiceError):
    """The store that keeps suspended runs is unreachable."""

    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE


def resume_error(exc: MemoryStoreError) -> ServiceError:
    """A store error met while resuming or listing suspended runs, as the API answers it: what
    happened, never the store's address or the driver's text (`client_message`; the log has it).
    A refusal of the request itself (an unknown run, a bad id) is the caller's answer alone: not
    logged as the store failing."""
    message = client_message(exc)
    if not about_the_request(exc):
        log.warning("suspended runs: the store failed: %s", exc)
    for kind, answer in _RESUME_ERRORS:
        if isinstance(exc, kind):
            return answer(message)
    return ServiceError(message)


_RESUME_ERRORS: tuple[tuple[type[MemoryStoreError], type[ServiceError]], ...] = (
    (SuspendedRunNotFoundError, SuspendedRunGoneError),
    (ResumeConflictError, ResumeRefusedError),
    (InvalidMemoryInputError, BadRequestError),
    (StoreUnavailableError, StoreDownError),
)
