"""The orchestrator's exception tree: one root, each error says what failed and where."""

from __future__ import annotations

from typing import Any


class OrchestratorError(Exception):
    """Root of every orchestrator error."""

    result: Any = None
    """For a failed generate(): the partial `RunResult` (run id, steps, usage)."""


class ConfigError(OrchestratorError):
    """The configuration is invalid; the message names the key."""


class SidecarStartError(OrchestratorError):
    """A sidecar process that this process started exited, or did not report SERVING in time."""


class ServiceStartError(OrchestratorError):
    """The orchestrator's own HTTP or gRPC server could not start."""


class ScenarioError(OrchestratorError):
    """A conformance scenario cannot be run: a malformed file, or a runtime that is not installed."""


class ProcessorFailedError(OrchestratorError):
    """A processor call failed under fail-closed policy (connect, timeout, status, malformed)."""

    def __init__(self, processor_id: str, hook: str, cause: str) -> None:
        super().__init__(f"processor {processor_id!r} failed in {hook}: {cause}")
        self.processor_id = processor_id
        self.hook = hook
        self.cause = cause


class RunTimeoutError(OrchestratorError):
    """The run did not finish within the timeout its caller gave."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"the run did not finish within its timeout of {timeout:g}s")
        self.timeout = timeout


class APICallError(OrchestratorError):
    """The model provider rejected or failed a call (one type for every provider)."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        body: str = "",
        retryable: bool = False,
        error_id: str = "",
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.body = body
        self.retryable = retryable
        self.error_id = error_id
        self.details = details or {}


class RequestContextError(OrchestratorError, ValueError):
    """A run's request context is not one its agent accepts (its ``requestContextSchema``: a
    required key missing, a key not declared, a value of the wrong shape) or gives a processor an
    option its published schema refuses (the APIs answer 400 / INVALID_ARGUMENT): nothing of the
    run was called. `keys` names the request-context keys at fault (when known)."""

    def __init__(self, message: str, *, keys: list[str] | None = None) -> None:
        super().__init__(message)
        self.keys = list(keys or ())


class TripwireAbort(OrchestratorError):
    """A processor aborted; carries the tripwire fields the result and chunk expose."""

    def __init__(
        self,
        processor_id: str,
        reason: str,
        retry: bool,
        metadata: Any,
        hook: str,
        source: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(reason)
        self.processor_id = processor_id
        self.reason = reason
        self.retry = retry
        self.metadata = metadata
        self.hook = hook
        self.source = source
        """(sidecar, processor id) of the lane entry that aborted, for its metrics' labels; None:
        a processor of the orchestrator itself."""

    def as_dict(self) -> dict[str, Any]:
        """The tripwire as the result and the chunk expose it."""
        return {
            "processorId": self.processor_id,
            "reason": self.reason,
            "retry": self.retry,
            "metadata": self.metadata,
        }


class DeployError(OrchestratorError):
    """The Kubernetes manifests cannot be rendered (kubectl missing or failing), or their pod run locally."""


class ProcessorCallError(OrchestratorError):
    """A processor call went wrong on the wire: a gRPC status, translated where the call is made.

    The processor's failure policy decides what follows (`ProcessorFailedError`, or skipped),
    except when the sidecar refused the input itself (`input_refused`): a fail-open policy must not
    let through what the guard could not read.
    """

    def __init__(self, message: str, *, input_refused: bool = False) -> None:
        super().__init__(message)
        self.input_refused = input_refused


class MalformedResponseError(ProcessorCallError):
    """A sidecar's response breaks the contract (its failure policy decides, as for any failed call)."""


class SuspendError(OrchestratorError):
    """A tool call needs approval (or suspended itself) but the run cannot be kept (no store
    configured), or a suspended run cannot resume here."""


class ResumeMismatchError(SuspendError):
    """A suspended call was answered with the wrong kind of answer: resume data for a call
    awaiting approval that is not ``{approved, reason?}``, or an approval for a call that
    suspended itself and awaits data. The run stays suspended."""


class MemoryStoreError(OrchestratorError):
    """Memory could not be read or written. The store's own errors name it (for the log); what a
    client reads of them is `store._redact.client_message`, without the store's address."""


class StoreUnavailableError(MemoryStoreError):
    """The store is down or unreachable (a run fails saying so; the HTTP API answers 503)."""


class ThreadNotFoundError(MemoryStoreError):
    """The resource has no thread of this id (thread ids are scoped by resource: another's thread
    of the same id is another thread; the API answers 404)."""


class InvalidMemoryInputError(MemoryStoreError):
    """The store refuses an argument before touching its data: an id that is empty, too long or not a
    string, a message that is not JSON or over the size limit (the HTTP API answers 400)."""


class SuspendedRunNotFoundError(MemoryStoreError):
    """No suspended run has this id, or the run awaits no tool call of this id (the API answers 404)."""


class ResumeConflictError(MemoryStoreError):
    """The suspended run is already being resumed: a second approval, or a concurrent one on another
    replica (the API answers 409)."""


class LeaseLostError(MemoryStoreError):
    """The caller no longer holds the durable run's lease: another replica claimed it, or the run
    is no longer running (the API answers 409). The caller must stop working on the run."""


class FencedWriteError(LeaseLostError):
    """A write of a durable run's holder under an epoch (fencing token) that is no longer the run's:
    another replica claimed the run since (however long this one slept). Nothing was written; the
    writer must stop working on the run. `epoch` is the writer's, `current` the run's (None when
    the run is gone)."""

    def __init__(self, message: str, epoch: int | None = None, current: int | None = None) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.current = current


class DurableRunNotFoundError(MemoryStoreError):
    """No durable run has this id (the API answers 404)."""


class DurableRunExistsError(MemoryStoreError):
    """A durable run of this id exists already (the API answers 409)."""


class McpError(OrchestratorError):
    """An MCP server failed: it could not start or connect, a call timed out, or the connection broke.

    The message names the server and what failed. A tool that answers with isError is no
    `McpError`: that result goes back to the model.
    """

    def __init__(self, server: str, cause: str) -> None:
        super().__init__(f"MCP server {server!r}: {cause}")
        self.server = server
        self.cause = cause


class EventLogError(OrchestratorError):
    """The event log of durable runs refused or failed an operation; the message names the log and run.

    A gap in a run's offsets, an event after the log was finished, or a chunk that is not JSON.
    """


class EventLogUnavailableError(EventLogError):
    """The event log is down or unreachable (a run fails naming it; the HTTP API answers 503)."""


class EventLogNotFoundError(EventLogError):
    """The run has no event log: it never existed, or its retention expired (the API answers 404)."""


class EventLogFencedError(EventLogError):
    """The log refused a durable run's write under an epoch (fencing token) below the run's current
    one: another replica claimed the run since. Nothing was written. `epoch` is the writer's,
    `current` the log's."""

    def __init__(self, message: str, epoch: int | None = None, current: int | None = None) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.current = current
