"""The procmesh exception tree and its one mapping to gRPC status codes.

Every error the SDK raises derives from `ProcmeshError`. Each subclass binds one
`grpc.StatusCode`; the server aborts a call with the code of the error it
caught, and the client re-raises the same class from the status it received.
"""

from __future__ import annotations

import grpc

__all__ = [
    "DeadlineExceededError",
    "InternalError",
    "InvalidInputError",
    "NotFoundError",
    "NotReadyError",
    "ProcmeshError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "error_for_status",
    "translate_rpc_error",
]


class ProcmeshError(Exception):
    """Root of every procmesh error."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN


class InvalidInputError(ProcmeshError):
    """A request or a hook's return value is malformed (INVALID_ARGUMENT)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(ProcmeshError):
    """The request names a processor the server does not host (NOT_FOUND)."""

    code = grpc.StatusCode.NOT_FOUND


class UnimplementedError(ProcmeshError):
    """The processor does not implement the called hook (UNIMPLEMENTED)."""

    code = grpc.StatusCode.UNIMPLEMENTED


class ResourceExhaustedError(ProcmeshError):
    """A size or rate limit was exceeded (RESOURCE_EXHAUSTED)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceededError(ProcmeshError):
    """The call did not finish before its deadline (DEADLINE_EXCEEDED)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class UnavailableError(ProcmeshError):
    """The sidecar could not be reached, or is starting or draining (UNAVAILABLE)."""

    code = grpc.StatusCode.UNAVAILABLE


class NotReadyError(UnavailableError):
    """The server is starting or draining (UNAVAILABLE).

    UNAVAILABLE, not FAILED_PRECONDITION: it is the code gRPC clients retry and load balancing
    steers around, so a call that reaches a replica still in setup or already draining goes to
    another. On the wire it is indistinguishable from any other UNAVAILABLE, so the client
    re-raises it as `UnavailableError` (its base class).
    """


class UnauthenticatedError(ProcmeshError):
    """The caller's credentials were missing or wrong (UNAUTHENTICATED)."""

    code = grpc.StatusCode.UNAUTHENTICATED


class FailedPreconditionError(ProcmeshError):
    """The request asks for what this processor did not declare, e.g. a rewind of one that is
    not speculative (FAILED_PRECONDITION): resending it will not help."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class InternalError(ProcmeshError):
    """The processor raised an unexpected exception (INTERNAL)."""

    code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[ProcmeshError]] = {
    cls.code: cls
    for cls in (
        InvalidInputError,
        NotFoundError,
        UnimplementedError,
        ResourceExhaustedError,
        DeadlineExceededError,
        UnavailableError,
        UnauthenticatedError,
        FailedPreconditionError,
        InternalError,
    )
}


def error_for_status(code: grpc.StatusCode, details: str) -> ProcmeshError:
    """The procmesh error for a gRPC status (UNKNOWN and unmapped codes give `ProcmeshError`)."""
    cls = _BY_CODE.get(code, ProcmeshError)
    err = cls(details)
    if cls is ProcmeshError:
        err.code = code
    return err


def translate_rpc_error(exc: grpc.aio.AioRpcError) -> ProcmeshError:
    """The procmesh error for a failed gRPC call (`ProcessorClient`'s calls, the model gateway
    client's Generate and the orchestrator's output stream all come here; a GenerateBatch call's
    status, given per call, goes to `error_for_status` itself); its message is the status details,
    or the code's name without any."""
    return error_for_status(exc.code(), exc.details() or exc.code().name)
