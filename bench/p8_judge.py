"""P8 guards' scripted judge in a process of its own, as a real judge is a remote service.

Run by ``bench/p10_guards_planner.py`` (``python -m bench.p8_judge DELAY KEY DELAYS_JSON``): it
serves ``tests/e2e/guards/golden_judge.GoldenJudge`` (OpenAI-compatible, every answer after DELAY
seconds, or the per-model delay of DELAYS_JSON), prints its base URL on stdout, then answers
``count <model>`` lines on stdin with the requests for that model so far, one number a line; it
stops when stdin closes. In the bench's own process the judge shared the GIL and the garbage
collector with the bench's client and the reference worker's pipe: full collections of 80-90 ms
there held its answers back, which a remote judge never suffers.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from tests.e2e.guards.golden_judge import GoldenJudge, load_golden


class _NoLog(list[Any]):
    """The judge's request log, kept empty: only the counts are read, and thousands of recorded
    bodies would only lengthen this process's own collections."""

    def append(self, item: Any) -> None:
        pass


def main(argv: list[str]) -> None:
    delay, key, delays = float(argv[0]), argv[1], json.loads(argv[2])
    judge = GoldenJudge(load_golden(), delay=delay, api_key=key, delays=delays)
    judge.requests = _NoLog()
    judge.start()
    try:
        print(judge.base_url, flush=True)
        for line in sys.stdin:
            command, _, model = line.strip().partition(" ")
            if command != "count":
                raise SystemExit(f"p8_judge: unknown command {line.strip()!r}")
            print(judge.count(model), flush=True)
    finally:
        judge.stop()


class JudgeProcess:
    """The judge as a child process of the bench: its base URL, and its counts over the pipe."""

    def __init__(self, proc: asyncio.subprocess.Process, base_url: str) -> None:
        self._proc = proc
        self.base_url = base_url
        self._lock = asyncio.Lock()

    @classmethod
    async def start(cls, delay: float, key: str, delays: dict[str, float]) -> JudgeProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.p8_judge",
            str(delay),
            key,
            json.dumps(delays),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        if not line:
            raise RuntimeError(f"P8: the judge process exited ({await proc.wait()})")
        return cls(proc, line.decode().strip())

    async def count(self, model: str) -> int:
        """Requests for `model` the judge received so far."""
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        async with self._lock:
            self._proc.stdin.write(f"count {model}\n".encode())
            await self._proc.stdin.drain()
            line = await asyncio.wait_for(self._proc.stdout.readline(), 30)
        if not line:
            raise RuntimeError(f"P8: the judge process exited ({await self._proc.wait()})")
        return int(line)

    async def stop(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            await asyncio.wait_for(self._proc.wait(), 10)
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
