"""Where a run's failed model call ends: its next attempt begins with its next hook call.

A model call that fails gives up its attempt (`App.failed`, before the error processors are
asked): the model gateway cancels the judge questions its guards have in flight, and refuses
those they send after it (a window closed as the stream broke, a verdict task that woke late)
until the run's next attempt begins. That moment is the run's first hook call after the failure
other than the failure's own ``process_api_error``: a retry's or a fallback's output stream (or
its rehearsal), the next step's hooks, the run's end. The run's hook caller tells the App of it
(`GrpcHookCaller.on_call`, made by `attempt_beginnings`).
"""

from __future__ import annotations

from collections.abc import Callable

from procmesh_orchestrator.run.hooks import APIErrorArgs, RunInfo

_FAILURE = APIErrorArgs.hook


def attempt_beginnings(info: RunInfo, began: Callable[[str], object]) -> Callable[[str], None]:
    """A run's hook caller's ``on_call``: tells `began` the run's id at each hook call but the
    failure's own (``process_api_error``)."""

    def called(hook: str) -> None:
        if hook != _FAILURE:
            began(info.run_id)

    return called
