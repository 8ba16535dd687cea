"""`RequestContext`: the run's request context as a hook is handed it, and the values it sets.

The hook's ``request_context`` argument is a dict of the run's context (the caller's keys and those
earlier hooks set). ``request_context.set(key, value)`` (or ``request_context[key] = value``) sets
a value, as the seeds' ``requestContext.set`` does in ``processInput``: the hook's answer carries it
(``HookEffects.request_context_updates``), and the orchestrator gives it to the run's later hooks,
its tools and a resumed run. Keys cannot be removed. The orchestrator refuses a key it sets itself
(``threadId``, ``resourceId``, ...) or one the agent's ``requestContextSchema`` does not accept:
the call then counts as failed, under the processor's failure policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from procmesh import convert


class RequestContext(dict[str, Any]):
    """The run's request context; `set` (or item assignment) records a value for the run."""

    def __init__(self, values: Mapping[str, Any], updates: dict[str, Any] | None) -> None:
        """`updates`: where `set` records values for the run; None where a hook cannot set any
        (``process_output_stream``: `set` raises)."""
        super().__init__(values)
        self._updates = updates

    def set(self, key: str, value: Any) -> None:
        """Set `key` to `value` (any JSON) for the rest of the run: later hooks and tools see it."""
        if self._updates is None:
            raise TypeError(
                "request_context.set: process_output_stream cannot set request-context values "
                "(a unary hook can)"
            )
        if not isinstance(key, str) or not key:
            raise TypeError(f"request_context.set: the key must be a non-empty string, got {key!r}")
        try:
            convert.to_value(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"request_context.set({key!r}): the value must be JSON: {exc}") from None
        super().__setitem__(key, value)
        self._updates[key] = value

    def __setitem__(self, key: str, value: Any) -> None:
        self.set(key, value)

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Set every pair given, as `set` does."""
        for key, value in dict(*args, **kwargs).items():
            self.set(key, value)

    def setdefault(self, key: str, default: Any = None) -> Any:
        """The value of `key`; absent, `default`, set as `set` does."""
        if key not in self:
            self.set(key, default)
        return self[key]

    def _no_removal(self, *_: Any) -> NoReturn:
        raise TypeError("a hook cannot remove request-context keys (set a value instead)")

    __delitem__ = _no_removal
    pop = _no_removal
    popitem = _no_removal
    clear = _no_removal

    def __ior__(self, other: Iterable[Any]) -> RequestContext:  # type: ignore[override,misc]
        self.update(other)
        return self
