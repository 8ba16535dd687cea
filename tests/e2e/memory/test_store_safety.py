"""Data safety of the memory stores, through real OS processes (`tests/e2e/memory/saver.py`).

- A writer SIGKILLed in the middle of saving leaves each turn whole or absent, on both stores. The
  kill is aimed: the test waits until the writer holds an open transaction (SQLite: its write lock
  is taken; PostgreSQL: its backend is inside a transaction with an INSERT) and kills it then.
- Two writer processes, 200 turns over 20 threads, started at the same instant on an empty
  database (so their migrations race too): every turn exactly once, each turn's messages together,
  each writer's turns in order in every thread, retried saves included.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from procmesh_orchestrator.store import StorageConfig, open_store
from tests.conftest import REPO
from tests.integration.memory.conftest import postgres_dsn  # noqa: F401 (the fixture, by getfixturevalue)
from tests.integration.memory.pg import fresh_dsn

pytestmark = pytest.mark.e2e

THREADS = 20


@dataclass
class Saver:
    """A running saver process and the lines it printed so far (read by a thread)."""

    proc: subprocess.Popen[str]
    log: Path
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def numbers(self, word: str) -> set[int]:
        return {int(line.split()[1]) for line in list(self.lines) if line.startswith(word + " ")}

    def finish(self, timeout: float = 120) -> int:
        """Wait for the exit, take the last lines, close the pipe; the exit code."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return code

    def errors(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def start_saver(backend: str, location: str, writer: str, *args: str, logs: Path) -> Saver:
    command = [sys.executable, "-m", "tests.e2e.memory.saver", "--backend", backend, "--location", location]
    log = logs / f"saver-{writer}.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [*command, "--writer", writer, *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
    return Saver(proc, log)


def read_store(backend: str, location: str) -> dict[int, list[str]]:
    """Every thread's stored message ids, in stored order, read through a fresh store."""
    config = (
        StorageConfig(path=location)
        if backend == "sqlite"
        else StorageConfig(backend="postgres", dsn=location)
    )

    async def read() -> dict[int, list[str]]:
        store = open_store(config)
        await store.start()
        try:
            return {
                t: [m["id"] for m in await store.messages(f"thread-{t}", "resource")] for t in range(THREADS)
            }
        finally:
            await store.close()

    return asyncio.run(read())


def turns_of(stored: dict[int, list[str]]) -> dict[int, list[tuple[str, int, list[int]]]]:
    """Per thread: its runs of consecutive messages of one turn, as (writer, turn, parts)."""
    runs: dict[int, list[tuple[str, int, list[int]]]] = {}
    for thread, message_ids in stored.items():
        runs[thread] = []
        for message_id in message_ids:
            writer, n, k = message_id.rsplit("-", 2)
            if runs[thread] and runs[thread][-1][:2] == (writer, int(n)):
                runs[thread][-1][2].append(int(k))
            else:
                runs[thread].append((writer, int(n), [int(k)]))
    return runs


def sqlite_writing(path: str) -> bool:
    """Whether another connection holds the file's write lock, i.e. is inside a write transaction."""
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        return "locked" in str(exc)
    finally:
        conn.close()


def postgres_writing(admin: psycopg.Connection[tuple[object, ...]], application: str) -> bool:
    """Whether the writer's backend is inside a transaction that has run an INSERT."""
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND xact_start IS NOT NULL "
        "AND state IN ('active', 'idle in transaction') AND query LIKE 'INSERT INTO%%'",
        (application,),
    ).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_sigkill_in_the_middle_of_saving_leaves_whole_turns_or_none(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    rounds, parts = 8, 6
    base = (
        str(tmp_path / "memory.db")
        if backend == "sqlite"
        else fresh_dsn(request.getfixturevalue("postgres_dsn"))
    )
    rng = random.Random(15)
    acknowledged: dict[str, set[int]] = {}
    in_flight: dict[str, set[int]] = {}
    aimed = 0
    admin = None if backend == "sqlite" else psycopg.connect(base, autocommit=True)
    request.addfinalizer(lambda: admin.close() if admin is not None else None)
    for r in range(rounds):
        writer, application = f"k{r}", f"pm-saver-k{r}"
        location = base if backend == "sqlite" else make_conninfo(base, application_name=application)
        # 4 threads: PostgreSQL has up to 4 turns in flight at the kill; SQLite serializes them.
        saver = start_saver(
            backend,
            location,
            writer,
            "--turns",
            "100000",
            "--threads",
            "4",
            "--messages",
            str(parts),
            "--size",
            "65536",
            logs=tmp_path,
        )
        target = rng.randint(2, 8)
        try:
            wait_until(lambda: len(saver.numbers("saved")) >= target, saver)  # noqa: B023 (used at once)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if sqlite_writing(base) if admin is None else postgres_writing(admin, application):
                    break
            aimed += time.monotonic() < deadline
            os.killpg(saver.proc.pid, signal.SIGKILL)
        finally:
            saver.proc.kill()
            assert saver.finish() == -signal.SIGKILL
        acknowledged[writer] = saver.numbers("saved")
        in_flight[writer] = saver.numbers("saving") - acknowledged[writer]

    stored = read_store(backend, base)
    found: Counter[tuple[str, int]] = Counter()
    torn = 0
    for thread_runs in turns_of(stored).values():
        for writer, n, ks in thread_runs:
            found[(writer, n)] += 1
            torn += ks != list(range(parts))
    lost = sum(1 for w, ns in acknowledged.items() for n in ns if found[(w, n)] != 1)
    flight = [(w, n) for w, ns in in_flight.items() for n in ns]
    whole_in_flight = sum(1 for key in flight if found[key] == 1)
    print(
        f"\n[store-safety {backend}] {rounds} SIGKILLs ({aimed} inside an open write transaction): "
        f"{sum(found.values())} turns stored, {sum(len(v) for v in acknowledged.values())} acknowledged, "
        f"{lost} acknowledged but missing, {torn} torn, {len(flight)} in flight at the kill "
        f"({whole_in_flight} stored whole, {len(flight) - whole_in_flight} absent)"
    )
    assert torn == 0
    assert lost == 0  # an acknowledged save survives the writer's death
    assert all(count == 1 for count in found.values())
    assert aimed >= rounds // 2, "the kills should land inside a transaction"
    assert len(flight) - whole_in_flight >= 1, "at least one kill should have cut a save short"


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_two_writer_processes_save_every_turn_once_in_order(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    location = (
        str(tmp_path / "memory.db")
        if backend == "sqlite"
        else fresh_dsn(request.getfixturevalue("postgres_dsn"))
    )
    start_at = time.time() + 2.0  # both processes are up by then; their start-ups then race
    savers = [
        start_saver(
            backend,
            location,
            writer,
            "--turns",
            "100",
            "--threads",
            str(THREADS),
            "--resave-every",
            "7",
            "--start-at",
            str(start_at),
            logs=tmp_path,
        )
        for writer in ("A", "B")
    ]
    for saver in savers:
        assert saver.finish() == 0, saver.errors()
    stored = read_store(backend, location)
    runs = turns_of(stored)
    turns = Counter((writer, n) for thread_runs in runs.values() for writer, n, _ in thread_runs)
    all_ids = [message_id for ids in stored.values() for message_id in ids]
    duplicates = len(all_ids) - len(set(all_ids))
    torn = sum(ks != [0, 1] for thread_runs in runs.values() for _, _, ks in thread_runs)
    out_of_order = 0
    for thread_runs in runs.values():
        for writer in ("A", "B"):
            numbers = [n for w, n, _ in thread_runs if w == writer]
            out_of_order += numbers != sorted(numbers)
    switches = sum(a[0] != b[0] for thread_runs in runs.values() for a, b in itertools.pairwise(thread_runs))
    print(
        f"\n[store-safety {backend}] 2 processes x 100 turns over {THREADS} threads: {len(turns)} turns "
        f"stored, {len(all_ids)} messages, {duplicates} duplicates, {torn} torn, {out_of_order} threads out "
        f"of order, {switches} switches between the writers within threads"
    )
    assert len(turns) == 200
    assert set(turns.values()) == {1}
    assert len(all_ids) == 400
    assert duplicates == 0
    assert torn == 0
    assert out_of_order == 0
    if backend == "postgres":  # SQLite serializes writers (its busy handler may let one run ahead)
        assert switches > THREADS, "the writers should interleave on the threads"


def wait_until(condition: Callable[[], bool], saver: Saver, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if saver.proc.poll() is not None:
            raise AssertionError(f"the saver exited: {saver.errors()}")
        assert time.monotonic() < deadline, "the saver made no progress"
        time.sleep(0.01)
