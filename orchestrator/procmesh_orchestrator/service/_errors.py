"""The service's errors: one root under OrchestratorError, each class binds its HTTP status and gRPC code."""

from __future__ import annotations

from typing import ClassVar

import grpc

from procmesh_orchestrator.errors import OrchestratorError


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


class DrainingError(ServiceError):
    """The server is shutting down and takes no new runs."""

    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE
