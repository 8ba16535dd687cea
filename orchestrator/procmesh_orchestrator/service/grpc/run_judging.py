"""The judge calls a run has in flight at the gateway, cancelled when the run ends.

A guard's verdict task outlives the hook that started it (a streamed window is judged while later
parts arrive), so when a cheap check trips and ends the run, or the run is cancelled, the judge
questions its guards already asked would keep running and paying for verdicts nobody reads. The
gateway runs each run's typed-verdict requests here (sections, and verdicts asked alone); `end`
(called as the run ends, `App.run_ended`: every run, whether or not its caller chose its id)
cancels them: the planner then cancels a judge call once every section waiting for it is gone (a
merged call with a section of live work goes on), so the judge model's connection is closed. The
caller gets CANCELLED (``outcome="run_ended"``), never a verdict: nothing is cached or kept as a
repeat, and each is counted in ``procmesh_judge_calls_saved_total{processor,by="cancelled"}``.

A model call that fails mid-stream gives up its attempt the same way while the run goes on
(`failed`, called as the run's error processors are asked about the failure, `App.attempt_failed`):
the questions its guards asked about the failed attempt's text are cancelled then
(``outcome="attempt_failed"``), not left to run to their end. Every question of the run in flight
at that moment is the failed attempt's: the step's input processors answered before its model was
called, and a step's output processors wait for every verdict at its end. The retried attempt's
questions come after it and are its own; one identical to a cancelled question is asked again (the
verdict cache's join asks for itself when the question it joined is cancelled). A question the
failed attempt's guards send after the failure (a window closed as the stream broke, a verdict
task that woke late) is refused the same way (`refuse`: CANCELLED, ``outcome="attempt_failed"``,
counted as cancelled) without being asked, until the run's next attempt begins
(`App.failed_attempt`: its next hook call other than the failure's own ``process_api_error``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from procmesh_orchestrator.service.grpc.judge_sections import Refused
from procmesh_orchestrator.service.grpc.verdict_cache import cancelled_here

T = TypeVar("T")

_WHY = {"run_ended": "the run ended", "attempt_failed": "the model call the question judged failed"}
"""What the caller of a cancelled question is told, by its outcome."""


class RunJudging:
    """Section requests in flight, by run id."""

    def __init__(
        self,
        saved: Any,
        ends: list[Callable[[str], object]],
        failures: list[Callable[[str], object]],
        failed_attempt: Callable[[str], bool] = lambda _: False,
    ) -> None:
        """`saved`: the ``procmesh_judge_calls_saved_total`` counter; `ends`: the run-ended
        callbacks (`App.run_ended`: every run's end, however it started) this adds its `end` to;
        `failures`: the failed-attempt callbacks (`App.attempt_failed`) it adds `failed` to;
        `failed_attempt`: whether a run is between a failed model call and its next attempt."""
        self._saved = saved
        self._failed_attempt = failed_attempt
        ends.append(self.end)
        failures.append(self.failed)
        self._flying: dict[str, set[asyncio.Task[Any]]] = {}
        self._ended: dict[asyncio.Task[Any], str] = {}
        """A task cancelled here, and why (the outcome its caller is told)."""

    async def judging(self, run_id: str, processor: str, call: Awaitable[T]) -> T:
        """`call`'s result; `Refused` (CANCELLED) when `end(run_id)` came first. A run-less
        request ("" is many callers) is never cancelled here."""
        if not run_id:
            return await call
        task: asyncio.Task[T] = asyncio.ensure_future(call)
        flying = self._flying.setdefault(run_id, set())
        flying.add(task)
        try:
            return await task  # the caller cancelled (it hung up): the task is cancelled with it
        except asyncio.CancelledError:
            why = self._ended.get(task)
            if why is None or cancelled_here():
                raise
            self._saved.labels(processor, "cancelled").inc()
            raise Refused(
                grpc.StatusCode.CANCELLED,
                why,
                f"run {run_id[:64]!r}: {_WHY[why]} before its judge answered: the question was cancelled",
            ) from None
        finally:
            self._ended.pop(task, None)
            flying.discard(task)
            if not flying and self._flying.get(run_id) is flying:
                del self._flying[run_id]

    def refuses(self, run_id: str) -> bool:
        """Whether `refuse` refuses the run's questions now."""
        return bool(run_id) and self._failed_attempt(run_id)

    def refuse(self, run_id: str, processor: str) -> None:
        """Refuse (CANCELLED) a question of a run whose attempt failed and whose next has not begun:
        it is about the failed attempt's text, as those cancelled at the failure were."""
        if self.refuses(run_id):
            self._saved.labels(processor, "cancelled").inc()
            raise Refused(
                grpc.StatusCode.CANCELLED,
                "attempt_failed",
                f"run {run_id[:64]!r}: {_WHY['attempt_failed']} before the question came: it is refused",
            )

    def end(self, run_id: str) -> int:
        """Cancel the run's section requests in flight; how many there were."""
        return self._cancel(run_id, "run_ended")

    def failed(self, run_id: str) -> int:
        """A model call of the run failed: cancel its attempt's requests in flight (all the
        run's at this moment); how many there were. The run's later requests go on as ever."""
        return self._cancel(run_id, "attempt_failed")

    def _cancel(self, run_id: str, why: str) -> int:
        tasks = self._flying.get(run_id, set())
        for task in tasks:
            if not task.done():
                self._ended[task] = why
                task.cancel()
        return len(tasks)

    def __len__(self) -> int:
        return sum(len(tasks) for tasks in self._flying.values())
