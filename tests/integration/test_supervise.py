"""Crash-loop backoff of a supervised sidecar: a real child process that keeps crashing."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from procmesh_orchestrator.sidecar_process import CrashLoopBackoff, SidecarProcess, supervise


def test_the_delay_doubles_per_crash_up_to_the_cap_and_resets_after_a_long_run() -> None:
    backoff = CrashLoopBackoff(initial=0.5, cap=4.0, reset_after=30.0)
    assert [backoff.next_delay(uptime=0.1) for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.next_delay(uptime=31.0) == 0.5  # it ran long enough: a fresh start
    assert backoff.next_delay(uptime=0.1) == 1.0


async def test_a_crash_looping_process_is_restarted_with_growing_delays(tmp_path: Path) -> None:
    process = SidecarProcess([], f"unix://{tmp_path / 'never.sock'}", log_path=str(tmp_path / "log"))
    process.args = [sys.executable, "-c", "import sys; sys.exit(3)"]  # crashes at once, every time
    process.start()
    waits: list[float] = []
    polls = 0

    async def sleep(seconds: float) -> None:
        nonlocal polls
        if seconds == 0.01:  # a poll: give the child time to exit
            polls += 1
            await asyncio.sleep(0.05)
            return
        waits.append(seconds)
        if len(waits) == 4:
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await supervise(process, connect_timeout=0.5, poll=0.01, sleep=sleep)
    assert waits == [0.5, 1.0, 2.0, 4.0]
    assert process.proc is not None
    process.proc.wait(5)
