"""A separate OS process that saves turns to a memory store, for the data-safety tests.

    python -m tests.e2e.memory.saver --backend sqlite --location PATH --writer w1 --turns 100

Turn ``n`` goes to thread ``thread-{n % threads}`` and holds ``messages`` messages with the ids
``{writer}-{n}-{k}``, each padded to about ``size`` bytes. One task per thread saves that thread's
turns in order, all threads concurrently, so several writer processes interleave on every thread.
It prints ``saving N`` before and ``saved N`` after each save (flushed), so a test can kill it in the
middle of one; ``--resave-every E`` saves every E-th turn a second time (a retried write).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from procmesh_orchestrator.store import Message, StorageConfig, open_store


def turn(writer: str, n: int, count: int, size: int) -> list[Message]:
    pad = "x" * size
    return [
        {
            "id": f"{writer}-{n}-{k}",
            "role": "user" if k == 0 else "assistant",
            "content": {
                "format": 2,
                "parts": [{"type": "text", "text": f"{writer} turn {n} part {k} {pad}"}],
            },
        }
        for k in range(count)
    ]


async def main(args: argparse.Namespace) -> None:
    if args.backend == "sqlite":
        config = StorageConfig(path=args.location)
    else:
        config = StorageConfig(backend="postgres", dsn=args.location, max_connections=args.threads)
    store = open_store(config)
    if args.start_at:
        await asyncio.sleep(max(0.0, args.start_at - time.time()))  # start-ups (and migrations) race
    await store.start()

    async def thread_writer(t: int) -> None:
        for n in range(t, args.turns, args.threads):
            print(f"saving {n}", flush=True)
            await store.save_turn(f"thread-{t}", "resource", turn(args.writer, n, args.messages, args.size))
            print(f"saved {n}", flush=True)
            if args.resave_every and n % args.resave_every == 0:
                await store.save_turn(
                    f"thread-{t}", "resource", turn(args.writer, n, args.messages, args.size)
                )

    try:
        await asyncio.gather(*(thread_writer(t) for t in range(args.threads)))
    finally:
        await store.close()
    print("done", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["sqlite", "postgres"], required=True)
    parser.add_argument("--location", required=True, help="the SQLite file or the PostgreSQL DSN")
    parser.add_argument("--writer", required=True)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--threads", type=int, default=20)
    parser.add_argument("--messages", type=int, default=2)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--resave-every", type=int, default=0)
    parser.add_argument("--start-at", type=float, default=0.0, help="unix time to start at")
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
