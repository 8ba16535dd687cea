"""Signal-sending built-ins: the seeds' `ensure-final-response` and `steering-reminder` examples,
and `background-work-signals` (lifecycle notifications for background tool work)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from procmesh import Processor
from procmesh_sidecars.builtins._common import Message


class EnsureFinalResponseOptions(BaseModel):
    """Options of `ensure-final-response`."""

    max_steps: int = Field(gt=0)
    """The run's maxSteps (give the agent or the call the same value)."""
    contents: str | None = None
    """The reminder; default: the seeds' text naming the step."""


class EnsureFinalResponse(Processor):
    """On the last allowed step, reminds the model to stop calling tools and answer.

    The reminder is a reactive signal (appended after the conversation, so the
    prompt prefix stays cacheable), rendered as
    ``<system-reminder reason="max-steps-reached" step="N">...</system-reminder>``.
    """

    id = "ensure-final-response"
    description = "Sends a final-step reminder so the last step answers instead of calling tools."
    Options = EnsureFinalResponseOptions

    async def process_input_step(
        self, step_number: int, options: EnsureFinalResponseOptions, send_signal: Any
    ) -> None:
        if step_number != options.max_steps - 1:
            return
        contents = options.contents or (
            f"This is your final step (step {step_number + 1} of {options.max_steps}). "
            "Do not call any more tools. Summarize what you have found and give the user a complete "
            "final answer now."
        )
        await send_signal(
            {
                "type": "reactive",
                "contents": contents,
                "attributes": {"reason": "max-steps-reached", "step": step_number + 1},
            }
        )


class SteeringReminderOptions(BaseModel):
    """Options of `steering-reminder`."""

    contents: str = "Stay on the current task and keep answers under three sentences."
    """The instruction re-sent before every model call."""
    tag_name: str | None = None
    """Tag of the rendered reminder (default ``system-reminder``)."""
    attributes: dict[str, Any] | None = None


class SteeringReminder(Processor):
    """Re-sends a short control instruction before every model call as a transient signal.

    Transient: the model sees one fresh copy near the newest turn, and nothing is
    stored, so copies do not pile up and the cached prompt prefix stays stable.
    """

    id = "steering-reminder"
    description = "Keeps a short instruction next to the newest turn (transient reactive signal)."
    Options = SteeringReminderOptions

    async def process_input_step(self, options: SteeringReminderOptions, send_signal: Any) -> None:
        signal: dict[str, Any] = {"type": "reactive", "contents": options.contents, "transient": True}
        if options.tag_name:
            signal["tagName"] = options.tag_name
        if options.attributes:
            signal["attributes"] = options.attributes
        await send_signal(signal)


class BackgroundWorkSignalsOptions(BaseModel):
    """Options of `background-work-signals`."""

    tools: list[str] | None = None
    """Tools whose results may describe background work (absent: every tool)."""
    result_key: str = "_background"
    """The key of a result that describes background work (the runtime's records use it too)."""


Status = Literal["running", "completed", "failed", "cancelled"]
_DISPOSITIONS = ("deferred", "awaited")


class BackgroundWorkSignals(Processor):
    """Turns background-work lifecycle records into caller-scoped signals.

    The orchestrator's background runtime (a tool's ``background`` config) hands
    this processor each background call's lifecycle through ``process_tool_result``
    as ``{"_background": {"taskId", "disposition": "deferred"|"awaited", "status",
    "invocationKind"?, "executorRunId"?}}``; a tool that starts work of its own
    elsewhere may report it the same way in its result. When a task starts
    (status ``running``) the processor
    sends a ``work-deferred`` or ``work-awaited`` notification; when a later
    result (a tool result, or a tool invocation in the messages of a following
    step) reports the task ``completed``, ``failed`` or ``cancelled``, it sends
    one ``work-completed`` / ``work-failed`` notification. Notifications are per
    run and best-effort: a terminal record for a task this run did not start is
    ignored, and each task gets at most one terminal notification.
    """

    id = "background-work-signals"
    description = "Sends work-deferred/awaited and work-completed/failed notifications for background tools."
    Options = BackgroundWorkSignalsOptions

    async def process_tool_result(
        self,
        tool_name: str,
        tool_call_id: str,
        result: Any,
        run_id: str,
        options: BackgroundWorkSignalsOptions,
        state: dict[str, Any],
        send_signal: Any,
    ) -> None:
        await self._observe(tool_name, tool_call_id, result, run_id, options, state, send_signal)

    async def process_input_step(
        self,
        messages: list[Message],
        run_id: str,
        options: BackgroundWorkSignalsOptions,
        state: dict[str, Any],
        send_signal: Any,
    ) -> None:
        for msg in messages:
            for part in (msg.get("content") or {}).get("parts") or []:
                inv = part.get("toolInvocation") if part.get("type") == "tool-invocation" else None
                if inv and inv.get("state") == "result":
                    await self._observe(
                        str(inv.get("toolName", "")),
                        str(inv.get("toolCallId", "")),
                        inv.get("result"),
                        run_id,
                        options,
                        state,
                        send_signal,
                    )

    async def _observe(
        self,
        tool_name: str,
        tool_call_id: str,
        result: Any,
        run_id: str,
        options: BackgroundWorkSignalsOptions,
        state: dict[str, Any],
        send_signal: Any,
    ) -> None:
        if options.tools is not None and tool_name not in options.tools:
            return
        work = result.get(options.result_key) if isinstance(result, dict) else None
        if not isinstance(work, dict) or work.get("disposition") not in _DISPOSITIONS:
            return
        task_id = str(work.get("taskId") or tool_call_id)
        origin_call = str(work.get("originToolCallId") or tool_call_id)
        status = work.get("status", "running")
        tasks: dict[str, Any] = state.setdefault("tasks", {})
        payload: dict[str, Any] = {
            "originRunId": run_id,
            "originToolCallId": origin_call,
            "taskId": task_id,
            "invocationKind": work.get("invocationKind", "tool"),
            "disposition": work["disposition"],
            "status": status,
        }
        if work.get("executorRunId"):
            payload["executorRunId"] = work["executorRunId"]
        known = tasks.get(task_id)
        if known is not None:  # a later record (e.g. a status check) reports on the originating call
            payload["originToolCallId"] = origin_call = known["originToolCallId"]
        if status == "running":
            if known is not None:
                return
            tasks[task_id] = {
                "disposition": work["disposition"],
                "terminal": False,
                "originToolCallId": origin_call,
            }
            event = "work-awaited" if work["disposition"] == "awaited" else "work-deferred"
        elif status in ("completed", "failed", "cancelled"):
            if known is None or known["terminal"] or known["disposition"] != work["disposition"]:
                return
            known["terminal"] = True
            event = "work-completed" if status == "completed" else "work-failed"
        else:
            return
        await send_signal(
            {
                "type": "notification",
                "tagName": event,
                "contents": f"{event}: {origin_call}",
                "metadata": payload,
            }
        )
