"""Processors the benchmarks serve: no-op, pass-through and fixed-time guards, so only the hop and
the orchestrator's scheduling are measured."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from procmesh import Processor, ProcessorSettings, run

PASS_THROUGH = 10
"""pass-1 ... pass-10: enough for P7's longest lane."""
GUARDS = 3
GUARD_SECONDS = 0.05


class Noop(Processor):
    """processInputStep that changes nothing (P1)."""

    id = "noop"

    async def process_input_step(self) -> None:
        return None


class Slow(Processor):
    """processInputStep that takes a second: longer than any run deadline the bench gives (P5)."""

    id = "slow"

    async def process_input_step(self) -> None:
        await asyncio.sleep(1.0)


def passthrough(pid: str) -> Processor:
    """A speculative processOutputStream that returns every part unchanged (P2-P4, P7)."""

    class PassThrough(Processor):
        id = pid
        speculative = True

        async def process_output_stream(self, part: dict[str, Any]) -> dict[str, Any]:
            return part

    return PassThrough()


def guard(pid: str) -> Processor:
    """A speculative processInput that takes 50 ms and lets the input through (P6): a check
    against a model or a service, whose verdict depends only on the input."""

    class Guard(Processor):
        id = pid
        speculative = True

        async def process_input(self) -> None:
            await asyncio.sleep(GUARD_SECONDS)

    return Guard()


def processors() -> list[Processor]:
    """Everything a bench sidecar hosts."""
    return [
        Noop(),
        Slow(),
        *(passthrough(f"pass-{i}") for i in range(1, PASS_THROUGH + 1)),
        *(guard(f"guard-{i}") for i in range(1, GUARDS + 1)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", action="append", required=True)
    args = parser.parse_args()
    run(processors(), ProcessorSettings(listen=args.listen, log_level="WARNING"))


if __name__ == "__main__":
    main()
