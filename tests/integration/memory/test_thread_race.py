"""The race of issue 24 (finding 3), through the real run path on both real stores: tenant B's run
on a thread id against tenant A's first turn on the same id, 1,000 times per backend.

Before thread ids were scoped by resource, a run checked the thread's owner in one store call and
loaded its messages in another; A's first save landing in between put A's messages in B's prompt
(6 to 13 in 150 to 300 races). Here each race runs A's and B's `Agent.generate` (the memory
processors around a fake model) with `asyncio.gather`, A and B each on its own store object (two
SQLite connections to one file; two PostgreSQL pools), B started a little before, with or after A
(a seeded jitter), so B's load falls before A's save, across it and after it. A sixth of the races
each are ordered by construction instead (B starts once A's save has committed; A starts once B's
load has ended), so every ordering occurs however loaded the machine is: on a busy machine the
jitter alone once gave no "A saved before B loaded" in 1,000 PostgreSQL races. Every race must end
with 0 of A's words in any of B's model requests, A's turn saved whole in A's thread, and B's turn
in a thread of B's own.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter, defaultdict
from typing import Any, cast

from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.run.framework.memory import AgentMemory
from procmesh_orchestrator.run.messages import message_text
from procmesh_orchestrator.store import MemoryStore, Message
from tests.integration.memory.conftest import Backend
from tests.unit.orchestrator.run.fakes import FakeModel, agent

RACES = 1000
AT_ONCE = 20
"""Races run concurrently (each one A's run and B's run): bounds the time and the connections."""
B_LATEST = 0.06
"""B's run starts up to this many seconds after A's: long enough to come after A's save at times
(A's run takes a few milliseconds to tens of them, with the other races going on)."""
ANSWER = "(exhausted) "
"""What the fake model answers when it has no scripted response left."""


class Recording:
    """A store that records, in one global order, when each tenant's load began and ended and when
    its save was committed: which way each race went."""

    order = itertools.count()

    def __init__(
        self,
        store: MemoryStore,
        events: list[tuple[int, str, str, str]],
        seen: defaultdict[tuple[str, str, str], asyncio.Event],
    ) -> None:
        self.store = store
        self.events = events
        self.seen = seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def _mark(self, resource_id: str, what: str, thread_id: str) -> None:
        self.events.append((next(self.order), resource_id, what, thread_id))
        self.seen[(resource_id, what, thread_id)].set()

    async def messages(self, thread_id: str, resource_id: str, **kw: Any) -> list[Message]:
        self._mark(resource_id, "load", thread_id)
        try:
            return await self.store.messages(thread_id, resource_id, **kw)
        finally:
            self._mark(resource_id, "loaded", thread_id)

    async def save_turn(self, thread_id: str, resource_id: str, messages: list[Message], **kw: Any) -> None:
        await self.store.save_turn(thread_id, resource_id, messages, **kw)
        self._mark(resource_id, "saved", thread_id)


async def _delay(rng: random.Random, longest: float) -> None:
    """A few event-loop turns, or a sleep of up to `longest` seconds: where a run starts against
    the other's."""
    if rng.random() < 0.5:
        for _ in range(rng.randrange(12)):
            await asyncio.sleep(0)
    else:
        await asyncio.sleep(rng.random() * longest)


def _orderings(events: list[tuple[int, str, str, str]]) -> Counter[str]:
    """Per race: did A's save commit before B's load began, during it, or after it ended?"""
    at = {(who, what, thread): n for n, who, what, thread in events}
    out: Counter[str] = Counter()
    for race in range(RACES):
        thread = f"race-{race}"
        saved = at[("tenant-a", "saved", thread)]
        if saved < at[("tenant-b", "load", thread)]:
            out["A saved before B loaded"] += 1
        elif saved < at[("tenant-b", "loaded", thread)]:
            out["A saved while B loaded"] += 1
        else:
            out["A saved after B loaded"] += 1
    return out


async def test_tenant_b_never_reads_tenant_a_s_first_turn(backend: Backend) -> None:
    store_a, store_b = backend.open(), backend.open()
    await store_a.start()
    await store_b.start()
    events: list[tuple[int, str, str, str]] = []
    seen: defaultdict[tuple[str, str, str], asyncio.Event] = defaultdict(asyncio.Event)
    model_a, model_b = FakeModel(), FakeModel()
    bot_a = agent(model_a, [], memory=AgentMemory(cast(MemoryStore, Recording(store_a, events, seen)), 10))
    bot_b = agent(model_b, [], memory=AgentMemory(cast(MemoryStore, Recording(store_b, events, seen)), 10))
    rng = random.Random(24)
    try:

        async def run(bot: Any, text: str, thread: str, resource: str, start: Any) -> None:
            await start
            result = await bot.generate(text, CallOptions(thread_id=thread, resource_id=resource))
            assert (result.status, result.text) == ("success", ANSWER), result.error

        async def race(n: int) -> None:
            thread = f"race-{n}"
            a_start = _delay(random.Random(rng.random()), 0.002)
            b_start = _delay(random.Random(rng.random()), B_LATEST)
            if n % 6 == 0:  # B after A's save
                b_start.close()
                b_start = seen[("tenant-a", "saved", thread)].wait()
            elif n % 6 == 1:  # A after B's load
                a_start.close()
                a_start = seen[("tenant-b", "loaded", thread)].wait()
            await asyncio.gather(
                run(bot_a, f"secret-a-{n}", thread, "tenant-a", a_start),
                run(bot_b, f"hello-b-{n}", thread, "tenant-b", b_start),
            )

        for first in range(0, RACES, AT_ONCE):
            await asyncio.gather(*(race(n) for n in range(first, min(first + AT_ONCE, RACES))))

        # 0 reads of A's messages: none of B's 1,000 model requests holds a word of A's
        leaked = [r for r in model_b.requests if "secret-a" in repr(r.prompt)]
        assert len(model_b.requests) == RACES
        assert leaked == []
        # A's turn always saved, whole, in A's thread; B's in a thread of B's own
        for n in range(RACES):
            mine = await store_a.messages(f"race-{n}", "tenant-a")
            assert [message_text(m) for m in mine] == [f"secret-a-{n}", ANSWER]
            theirs = await store_b.messages(f"race-{n}", "tenant-b")
            assert [message_text(m) for m in theirs] == [f"hello-b-{n}", ANSWER]
        ways = _orderings(events)
        print(f"\n{backend.name}: {RACES} races, {len(leaked)} reads of A's messages; {dict(ways)}")
        # the races went every way: B's load before A's save, and after it (a sixth each by
        # construction, the rest as the jitter fell)
        assert ways["A saved before B loaded"] >= RACES // 6
        assert ways["A saved after B loaded"] >= RACES // 6
    finally:
        await store_a.close()
        await store_b.close()
