"""Processors the benchmarks serve: no-op and pass-through, so only the hop is measured."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from procmesh import Processor, ProcessorSettings, run


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
    """A processOutputStream that returns every part unchanged (P2-P4)."""

    class PassThrough(Processor):
        id = pid

        async def process_output_stream(self, part: dict[str, Any]) -> dict[str, Any]:
            return part

    return PassThrough()


def processors() -> list[Processor]:
    """Everything a bench sidecar hosts."""
    return [Noop(), Slow(), passthrough("pass-1"), passthrough("pass-2"), passthrough("pass-3")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", action="append", required=True)
    args = parser.parse_args()
    run(processors(), ProcessorSettings(listen=args.listen, log_level="WARNING"))


if __name__ == "__main__":
    sys.exit(main())
