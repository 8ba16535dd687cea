"""The Processor base class and what a hook is handed: abort, signals, writer (MessageList: _message_list)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, ClassVar, NoReturn

from pydantic import BaseModel

from procmesh import hooks
from procmesh.errors import InvalidInputError

Chunk = dict[str, Any]

HOOK_NAMES: tuple[str, ...] = tuple(hook.name for hook in hooks.HOOKS)
HOOK_ARGUMENTS: dict[str, frozenset[str]] = {hook.name: hook.arguments for hook in hooks.HOOKS}
"""The arguments each hook can declare (by name)."""

_SIGNAL_TYPES = {"reactive", "user", "notification", "state", "system-reminder", "user-message"}
_TAG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


class TripWire(Exception):
    """Raised by `abort()`: ends the hook and tells the orchestrator to stop or retry.

    Attributes:
        reason: Why the processor aborted (the default names the processor).
        retry: Ask the orchestrator to replay the step with the reason as feedback.
        metadata: JSON data attached to the tripwire (categories, scores, ...).
    """

    def __init__(self, reason: str, *, retry: bool = False, metadata: Any = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry = retry
        self.metadata = metadata


class Processor:
    """Base class for processors: set `id` and implement any of the hooks.

    Hooks are ``async`` methods named like the seeds' hooks in snake_case
    (`process_input`, `process_input_step`, `process_llm_request`,
    `process_llm_response`, `process_output_stream`, `process_output_step`,
    `process_tool_result`, `process_output_result`, `process_api_error`).
    A hook declares only the arguments it uses, by name (``async def
    process_output_stream(self, part, state, abort)``); ``**kwargs`` receives
    all of them. Each hook's arguments and return shapes are in docs/processors.md.

    Class attributes:
        id: Unique processor id (the orchestrator's config refers to it).
        name: Display name (defaults to the id).
        description: One line for `Describe`.
        process_data_parts: `process_output_stream` also receives ``data-*`` chunks.
        speculative: The hooks' results depend only on their input, options and state,
            and a call whose answer is thrown away has no effect outside it, so the
            orchestrator may call the processor before its input is final (and rewind
            its output stream). Declare it only for hooks that do not act on the world.
        Options: A pydantic model validating the options from the orchestrator's
            config; the hook's ``options`` argument is then an instance of it.
        quick_hooks: Where a call runs while the processor's own thread is idle (its code
            always runs on its own loop): None (default) on the server's thread once its loop's
            turns have been quick, back on its thread after a slow one; True (hooks trusted to be
            quick) on the server's thread from the first call, whatever a turn takes; False (a
            hook may compute for long at any call) always on its own thread, at the price of two
            thread wake-ups per call.
    """

    id: ClassVar[str] = ""
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    process_data_parts: ClassVar[bool] = False
    speculative: ClassVar[bool] = False
    Options: ClassVar[type[BaseModel] | None] = None
    quick_hooks: ClassVar[bool | None] = None

    async def setup(self) -> None:
        """Prepare resources; the server reports SERVING only after every setup returned."""

    async def teardown(self) -> None:
        """Release resources when the server stops."""

    @classmethod
    def implemented_hooks(cls) -> list[str]:
        """The hook names this processor overrides."""
        return [name for name in HOOK_NAMES if callable(getattr(cls, name, None))]


def hook_parameters(fn: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword arguments a hook declares, or None when it takes ``**kwargs``."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.name != "self")


class HookEffects:
    """What a hook did besides its return value: abort, signals, custom chunks, violations, and
    the request-context values it set."""

    __slots__ = ("abort", "context_updates", "custom_chunks", "processor_id", "signals", "violations")

    def __init__(self, processor_id: str) -> None:
        self.processor_id = processor_id
        self.signals: list[dict[str, Any]] = []
        self.custom_chunks: list[Chunk] = []
        self.violations: list[tuple[str, Any]] = []
        self.abort: TripWire | None = None
        self.context_updates: dict[str, Any] | None = {}
        """Request-context values the hook set (`request_context.set`), in order; None where it
        cannot set any (an output-stream session)."""

    def quiet(self) -> bool:
        """It did nothing of these (`fill_effects` would write nothing but the state)."""
        return (
            self.abort is None
            and not self.signals
            and not self.custom_chunks
            and not self.violations
            and not self.context_updates
        )

    def abort_hook(self, reason: str | None = None, *, retry: bool = False, metadata: Any = None) -> NoReturn:
        """The hook's ``abort(reason, retry=..., metadata=...)``."""
        raise TripWire(reason or f"Tripwire triggered by {self.processor_id}", retry=retry, metadata=metadata)

    async def send_signal(self, signal: dict[str, Any]) -> None:
        """The hook's ``send_signal({...})``: validated here, applied by the orchestrator."""
        if not isinstance(signal, dict):
            raise InvalidInputError("send_signal expects a dict like {'type': 'reactive', 'contents': ...}")
        kind = signal.get("type", "reactive")
        if kind not in _SIGNAL_TYPES:
            raise InvalidInputError(f"send_signal: unknown signal type {kind!r}")
        if not isinstance(signal.get("contents"), str):
            raise InvalidInputError("send_signal: 'contents' must be a string")
        tag = signal.get("tagName")
        if tag not in (None, "") and not (isinstance(tag, str) and _TAG_NAME.match(tag)):
            raise InvalidInputError(f"send_signal: invalid tagName {tag!r}")
        for key in ("attributes", "metadata"):
            if not isinstance(signal.get(key) or {}, dict):
                raise InvalidInputError(f"send_signal: {key!r} must be a dict")
        for attr in signal.get("attributes") or {}:
            if not _TAG_NAME.match(str(attr)):
                raise InvalidInputError(f"send_signal: invalid attribute name {attr!r}")
        if kind == "state" and signal.get("transient"):
            raise InvalidInputError("send_signal: state signals cannot be transient")
        self.signals.append(dict(signal))

    def report_violation(self, message: str, detail: Any = None) -> None:
        """Report a violation without aborting (warn strategies); reaches onViolation."""
        self.violations.append((message, detail))


class Writer:
    """The hook's ``writer``: `custom()` emits a ``data-*`` chunk to the client."""

    def __init__(self, effects: HookEffects) -> None:
        self._effects = effects

    async def custom(self, chunk: Chunk) -> None:
        """Emit a custom chunk ``{"type": "data-...", "data": ...}``."""
        kind = chunk.get("type") if isinstance(chunk, dict) else None
        if not isinstance(kind, str) or not kind.startswith("data-"):
            raise InvalidInputError(f"writer.custom: chunk type must start with 'data-', got {kind!r}")
        self._effects.custom_chunks.append(chunk)
