"""`procmesh memory threads|messages`: what a store holds, read with the config's `storage` section.

The same store the orchestrator uses (SQLite by default, PostgreSQL for replicas), opened read-only
in effect: listing never writes. Threads are listed per resource, as the store keeps them, and a
thread's messages are read with its resource (thread ids are scoped by resource).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the store code is imported when the command runs, not for every `procmesh`
    from procmesh_orchestrator.store import Message, Thread


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The `memory` command and its two actions."""
    memory = sub.add_parser(
        "memory", help="list a memory store's threads and messages (the config's storage)"
    )
    actions = memory.add_subparsers(dest="action", required=True)
    threads = actions.add_parser("threads", help="a resource's threads, most recently updated first")
    threads.add_argument("--resource", required=True, help="whose threads (a user, an org)")
    threads.add_argument(
        "--limit",
        type=int,
        default=100,
        help="at most this many, the most recent (1 to 9999, default 100); more: a note on stderr",
    )
    messages = actions.add_parser("messages", help="a thread's stored messages, oldest first")
    messages.add_argument("thread", help="the thread id")
    messages.add_argument(
        "--resource", required=True, help="whose thread (thread ids are scoped by resource)"
    )
    messages.add_argument("--last", type=int, help="only the last N messages")
    messages.add_argument(
        "--signals", action="store_true", help="include persisted signals (hidden from default recall)"
    )
    for p in (threads, messages):
        p.add_argument("--config", help="YAML configuration file (default: PROCMESH_CONFIG_FILE)")
        p.add_argument("--json", action="store_true", help="one JSON object per line")
    return memory


def _thread_json(thread: Thread) -> dict[str, object]:
    return {
        "id": thread.id,
        "resourceId": thread.resource_id,
        "title": thread.title,
        "metadata": thread.metadata,
        "createdAt": thread.created_at,
        "updatedAt": thread.updated_at,
    }


def _text(msg: Message) -> str:
    content = msg.get("content") or {}
    if isinstance(content, str):
        return content
    shown: list[str] = []
    for part in content.get("parts") or []:
        if part.get("type") == "text":
            shown.append(str(part.get("text", "")))
        elif part.get("type") == "tool-invocation":
            inv = part.get("toolInvocation") or {}
            shown.append(
                f"[tool {inv.get('toolName')} {json.dumps(inv.get('args'))} -> {inv.get('result')!r}]"
            )
    return " ".join(shown)


async def run(args: argparse.Namespace) -> int:
    """List threads or messages; exit 1 when the thread asked for does not exist."""
    from procmesh_orchestrator.cli._limit import limit_refused
    from procmesh_orchestrator.config import load_config
    from procmesh_orchestrator.store import MAX_PAGE, open_store

    if args.action == "threads" and limit_refused("memory threads", args.limit, MAX_PAGE - 1):
        return 2
    store = open_store(load_config(args.config).storage)
    await store.start()
    try:
        if args.action == "threads":
            # one more than asked: a list cut at --limit says so, never passed off as all of them
            threads = await store.list_threads(args.resource, limit=args.limit + 1)
            for thread in threads[: args.limit]:
                if args.json:
                    print(json.dumps(_thread_json(thread), ensure_ascii=False))
                else:
                    print(f"{thread.id}\t{thread.updated_at}\t{thread.title}")
            if len(threads) > args.limit:
                print(
                    f"procmesh memory threads: resource {args.resource!r} has more than --limit "
                    f"{args.limit} threads; these are its most recently updated: raise --limit",
                    file=sys.stderr,
                    flush=True,
                )
            return 0
        if await store.get_thread(args.thread, args.resource) is None:
            print(
                f"procmesh memory: no thread {args.thread!r} of resource {args.resource!r} in the store",
                file=sys.stderr,
                flush=True,
            )
            return 1
        for msg in await store.messages(
            args.thread, args.resource, last=args.last, include_signals=args.signals
        ):
            if args.json:
                print(json.dumps(msg, ensure_ascii=False))
            else:
                print(f"{msg.get('createdAt', '')}\t{msg.get('role')}\t{_text(msg)}")
        return 0
    finally:
        await store.close()
