"""Failure policy against real misbehaving sidecar processes (tests/fixtures/faulty.py).

Every failure kind (a hook raises, a hook is slower than its timeout, a malformed
response, the sidecar dies mid-stream) must end a fail-closed run with
`ProcessorFailedError` naming the processor and the hook, and must let a fail-open
run complete without the processor, counted in
``procmesh_processor_failures_let_through_total{processor,hook}``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config, parse_config
from procmesh_orchestrator.errors import ProcessorFailedError
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.run import CallOptions, RunResult
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.fixtures.faulty import LIAR_BAD_CHUNK_TYPE

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

FAULTY = "tests.fixtures.faulty"
ANSWER = "all is well"  # the scripted model streams it as 3 deltas
TIMEOUT = 0.3
# The sleeper outlasts the test's own time limit (pytest-timeout, 120 s), and so does a "long"
# processor timeout: a run held until the sleeper wakes, or until that timeout, cannot pass. This is
# how "not held" is shown without asserting the clock (which fails correct code under load).
SLEEP = 600.0
LONG_TIMEOUT = 300
LET_THROUGH = "procmesh_processor_failures_let_through_total"


@dataclass(frozen=True)
class Faulty:
    """Addresses of the module's faulty sidecar process: SDK processors and the raw liar."""

    address: str
    liar_address: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def faulty(start_sidecar: Callable[..., SidecarProcess], sidecar_dir: Path) -> Faulty:
    liar = f"unix://{sidecar_dir / 'liar.sock'}"
    proc = start_sidecar("--liar-listen", liar, name="faulty", module=FAULTY)
    await proc.wait_ready()  # the liar server is up before the SDK server reports SERVING
    return Faulty(proc.address, liar)


def make_config(
    sidecars: dict[str, dict[str, Any]],
    *,
    input_processors: Sequence[Any] = (),
    output_processors: Sequence[Any] = (),
    responses: list[dict[str, Any]] | None = None,
) -> Config:
    return parse_config(
        {
            "sidecars": sidecars,
            "models": {"scripted": {"provider": "scripted", "responses": responses or [{"text": ANSWER}]}},
            # each processor on its own call: a fused session's timeout would fail its neighbours too
            # (tests/e2e/speculation covers a fused member's failure)
            "fuse": False,
            "agents": {
                "a": {
                    "model": "scripted",
                    # no default error processors: App would start its built-in sidecar per test
                    "errorProcessorDefaults": False,
                    "inputProcessors": list(input_processors),
                    "outputProcessors": list(output_processors),
                }
            },
        },
        "test config",
    )


@dataclass(frozen=True)
class Case:
    """One failure kind: where it happens and what the cause says."""

    name: str
    sidecar: str  # "faulty" or "liar"
    processor: str
    hook: str
    cause: str  # a substring of ProcessorFailedError.cause
    options: dict[str, Any]
    after: str = ""  # a processor of the same sidecar right after it (two speculative ones: a group)

    @property
    def lane(self) -> str:
        return "output_processors" if self.hook == "process_output_stream" else "input_processors"

    def config(self, faulty: Faulty, policy: str, *, extra_output: Sequence[Any] = ()) -> Config:
        address = faulty.liar_address if self.sidecar == "liar" else faulty.address
        ref = {"processor": f"{self.sidecar}/{self.processor}", "options": self.options}
        lanes: dict[str, list[Any]] = {"input_processors": [], "output_processors": []}
        lanes[self.lane].append(ref)
        if self.after:
            lanes[self.lane].append(f"{self.sidecar}/{self.after}")
        lanes["output_processors"].extend(extra_output)
        sidecars = {self.sidecar: {"address": address, "timeout": TIMEOUT, "onFailure": policy}}
        if extra_output:
            sidecars.setdefault("faulty", {"address": faulty.address, "timeout": 5})
        return make_config(sidecars, **lanes)


CASES = [
    Case("raises", "faulty", "raiser", "process_input_step", "RuntimeError", {}),
    Case("slow-input", "faulty", "sleeper", "process_input_step", "DEADLINE_EXCEEDED", {"seconds": SLEEP}),
    Case("slow-stream", "faulty", "sleeper", "process_output_stream", "timed out", {"seconds": SLEEP}),
    Case("malformed", "liar", "liar", "process_input_step", "must start with 'data-'", {}),
    # its rewrite was dropped before, without a word: a redaction that redacted nothing
    Case("unflagged", "liar", "unflagged", "process_input_step", "messages is set but replace_messages", {}),
    # its parts were dropped before (emitted when the result carried effects), counted as emitted
    Case("extras-only", "liar", "unflagged", "process_output_stream", "extra_parts but no part", {}),
    # a result more than the parts once all were sent: it handed the end on without its states
    Case("chatty", "liar", "chatty", "process_output_stream", "more results than parts sent", {}),
    # a run of unchanged parts reaching past those sent: a speculative member's and a plain stage's
    Case("overreach", "liar", "overreach", "process_output_stream", "unchanged result", {}, "overreach-too"),
    Case("overreach-plain", "liar", "overreach-plain", "process_output_stream", "unchanged result", {}),
]
IDS = [c.name for c in CASES]


def let_through(app: App, processor: str, hook: str) -> float:
    return app.metrics.total(LET_THROUGH, processor=processor, hook=hook)


def model_calls(app: App) -> int:
    model = app.models["scripted"]
    assert isinstance(model, ScriptedModel)
    return len(model.requests)


def assert_names(exc_text: str, processor: str, hook: str) -> None:
    assert f"'{processor}'" in exc_text, exc_text
    assert hook in exc_text, exc_text


async def collect(app: App, text: str = "hi", options: CallOptions | None = None) -> tuple[list, RunResult]:
    stream = app.agent("a").stream(text, options)
    chunks = [chunk async for chunk in stream]
    return chunks, await stream.result()


def assert_error_ending(chunks: list[dict[str, Any]], result: RunResult, processor: str, hook: str) -> None:
    """The run ends at the error chunk: only finalization's data-* chunks and an error finish follow."""
    kinds = [c["type"] for c in chunks]
    assert kinds.count("error") == 1, kinds
    at = kinds.index("error")
    assert all(k.startswith("data-") for k in kinds[at + 1 : -1]), kinds
    assert kinds[-1] == "finish", kinds
    assert chunks[-1]["payload"]["finishReason"] == "error"
    message = chunks[at]["payload"]["message"]
    assert_names(message, processor, hook)
    assert result.error == message
    assert result.finish_reason == "error"
    assert result.tripwire is None


# -- fail-closed ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_fail_closed_generate_raises_naming_processor_and_hook(faulty: Faulty, case: Case) -> None:
    async with App(case.config(faulty, "fail-closed")) as app:
        with pytest.raises(ProcessorFailedError) as info:
            await app.agent("a").generate("hi")  # never held until a sleeper wakes: see SLEEP
        exc = info.value
        assert (exc.processor_id, exc.hook) == (case.processor, case.hook)
        assert_names(str(exc), case.processor, case.hook)
        assert case.cause in exc.cause
        if case.hook == "process_input_step":
            assert model_calls(app) == 0  # the failed input hook stopped the run before the model
        assert let_through(app, case.processor, case.hook) == 0


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_fail_closed_stream_ends_with_error_chunk(faulty: Faulty, case: Case) -> None:
    async with App(case.config(faulty, "fail-closed")) as app:
        chunks, result = await collect(app)
    assert_error_ending(chunks, result, case.processor, case.hook)
    assert LIAR_BAD_CHUNK_TYPE not in {c["type"] for c in chunks}


# -- fail-open -----------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_fail_open_generate_completes_and_counts(faulty: Faulty, case: Case) -> None:
    async with App(case.config(faulty, "fail-open")) as app:
        result = await app.agent("a").generate("hi")
        assert result.error is None
        assert result.text == ANSWER
        assert result.finish_reason == "stop"
        assert model_calls(app) == 1
        assert let_through(app, case.processor, case.hook) == 1
        outcome = {"processor": case.processor, "hook": case.hook, "outcome": "failed_open"}
        assert app.metrics.total("procmesh_processor_calls_total", **outcome) == 1


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_fail_open_stream_skips_the_processor(faulty: Faulty, case: Case) -> None:
    # A healthy counter after the failing processor must still see every part.
    async with App(case.config(faulty, "fail-open", extra_output=["faulty/counter"])) as app:
        chunks, result = await collect(app)
        assert let_through(app, case.processor, case.hook) == 1
        assert let_through(app, "counter", "process_output_stream") == 0
    kinds = [c["type"] for c in chunks]
    assert "error" not in kinds
    assert LIAR_BAD_CHUNK_TYPE not in kinds
    assert kinds[-1] == "finish"
    assert result.error is None
    assert result.text == ANSWER
    assert "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta") == ANSWER
    assert [c["data"] for c in chunks if c["type"] == "data-count"] == [{"deltas": 3}]


# -- a processor that cannot read the input fails the run under either policy -----------------


@pytest.mark.parametrize("hook", ["process_input_step", "process_output_stream"])
async def test_a_refused_input_is_never_let_through_by_fail_open(faulty: Faulty, hook: str) -> None:
    case = Case("refused", "faulty", "refuser", hook, "INVALID_ARGUMENT", {})
    async with App(case.config(faulty, "fail-open")) as app:
        chunks, result = await collect(app)
        assert let_through(app, "refuser", hook) == 0
        outcome = {"processor": "refuser", "hook": hook, "outcome": "input_refused"}
        assert app.metrics.total("procmesh_processor_calls_total", **outcome) == 1
        if hook == "process_input_step":
            assert model_calls(app) == 0  # the guard could not read it: the model never sees it
    assert_error_ending(chunks, result, "refuser", hook)
    assert "refused the input" in (result.error or "")


async def test_a_refusal_that_ends_the_stream_during_a_write_is_still_a_refusal(faulty: Faulty) -> None:
    """A sidecar that ends a stream while the orchestrator writes to it: grpc.aio then replaces
    the status it sent with INTERNAL "Internal error from Core" (grpc/grpc#36066), in about 4 of
    10 such streams. Its INVALID_ARGUMENT must still read as a refusal, or fail-open would let
    through what the guard refused. A long answer keeps parts in flight as the refuser ends each
    run's stream; every one of 30 runs is refused, none let through."""
    runs = 30
    deltas = [f"w{i} " for i in range(3000)]
    ref = {"processor": "faulty/refuser", "options": {}}
    sidecars = {"faulty": {"address": faulty.address, "timeout": 5, "onFailure": "fail-open"}}
    config = make_config(sidecars, output_processors=[ref], responses=[{"deltas": deltas}] * runs)
    async with App(config) as app:
        errors = [(await collect(app))[1].error or "" for _ in range(runs)]
        assert let_through(app, "refuser", "process_output_stream") == 0
        outcome = {"processor": "refuser", "hook": "process_output_stream", "outcome": "input_refused"}
        assert app.metrics.total("procmesh_processor_calls_total", **outcome) == runs
    # the sidecar's INVALID_ARGUMENT, or (when gRPC kept its own status) a loss read as a refusal
    assert all("refused the input" in e for e in errors), errors


# -- time bounds and the run deadline ------------------------------------------------------


@pytest.mark.parametrize("policy", ["fail-closed", "fail-open"])
@pytest.mark.parametrize("case", [c for c in CASES if c.processor == "sleeper"], ids=lambda c: c.name)
async def test_slow_processor_never_holds_the_run_past_its_timeout(
    faulty: Faulty, case: Case, policy: str
) -> None:
    async with App(case.config(faulty, policy)) as app:
        started = time.monotonic()
        _, result = await collect(app)  # held until the sleeper wakes, it could not pass: see SLEEP
        elapsed = time.monotonic() - started
    # a lower bound only (load can lengthen a run, never shorten it): the timeout was waited for
    assert elapsed >= TIMEOUT * 0.9, "the processor's timeout was not waited for at all"
    assert (result.error is None) == (policy == "fail-open")


@pytest.mark.parametrize("policy", ["fail-closed", "fail-open"])
@pytest.mark.parametrize("hook", ["process_input_step", "process_output_stream"])
async def test_run_deadline_caps_processor_calls(faulty: Faulty, hook: str, policy: str) -> None:
    """The processor's own timeout is long; the run's timeout is what ends the call."""
    ref = {"processor": "faulty/sleeper", "options": {"seconds": SLEEP}}
    lanes = "input_processors" if hook == "process_input_step" else "output_processors"
    cfg = make_config(
        {"faulty": {"address": faulty.address, "timeout": LONG_TIMEOUT, "onFailure": policy}},
        **{lanes: [ref]},
    )
    run_timeout = 0.4
    async with App(cfg) as app:
        # only the run's deadline can end the call in the test's time: see SLEEP and LONG_TIMEOUT
        chunks, result = await collect(app, options=CallOptions(timeout=run_timeout))
        assert let_through(app, "sleeper", hook) == (1 if policy == "fail-open" else 0)
    if policy == "fail-closed":
        assert_error_ending(chunks, result, "sleeper", hook)
        assert result.error is not None
        assert f"after {LONG_TIMEOUT}" not in result.error, "the cause must not claim the processor timeout"
    else:
        # The slow processor is skipped at the deadline; the run then has at most the 50 ms grace
        # left, so it either finishes within it or ends with the run timeout, never later.
        assert result.error is None or "did not finish within its timeout" in result.error
        assert result.error is not None or result.text == ANSWER


async def test_run_deadline_fails_generate_with_deadline_exceeded(faulty: Faulty) -> None:
    ref = {"processor": "faulty/sleeper", "options": {"seconds": SLEEP}}
    cfg = make_config(
        {"faulty": {"address": faulty.address, "timeout": LONG_TIMEOUT}}, input_processors=[ref]
    )
    async with App(cfg) as app:
        with pytest.raises(ProcessorFailedError) as info:  # only the run's deadline ends it: see SLEEP
            await app.agent("a").generate("hi", CallOptions(timeout=0.4))
    assert "DEADLINE_EXCEEDED" in info.value.cause


async def test_idle_stream_longer_than_the_timeout_is_not_a_failure(faulty: Faulty) -> None:
    """A healthy processor whose model pauses longer than its timeout between chunks.

    The timeout bounds each part's answer, not the gaps between parts: the stream
    must neither fail nor hang (it used to hang, the idle read's timeout cancelled the call).
    """
    cfg = make_config(
        {"faulty": {"address": faulty.address, "timeout": 0.2}},
        output_processors=["faulty/counter"],
        responses=[{"text": ANSWER}],
    )
    cfg = cfg.model_copy(
        update={"models": {"scripted": cfg.models["scripted"].model_copy(update={"delay_ms": 350})}}
    )
    async with App(cfg) as app:
        async with asyncio.timeout(10):
            chunks, result = await collect(app)
        assert (
            app.metrics.total(
                "procmesh_processor_calls_total",
                processor="counter",
                hook="process_output_stream",
                outcome="failed",
            )
            == 0
        )
    assert result.error is None
    assert result.text == ANSWER
    assert [c["data"] for c in chunks if c["type"] == "data-count"] == [{"deltas": 3}]


# -- the sidecar dies mid-stream (each test kills its own process) ---------------------------


_doomed_ids = itertools.count()


@pytest_asyncio.fixture(loop_scope="module")
async def doomed(start_sidecar: Callable[..., SidecarProcess]) -> AsyncIterator[SidecarProcess]:
    """A faulty sidecar of the test's own: the exiter kills it."""
    proc = start_sidecar(name=f"doomed{next(_doomed_ids)}", module=FAULTY)
    await proc.wait_ready()
    yield proc
    proc.stop(grace=2.0)


def killed_config(doomed: SidecarProcess, faulty: Faulty, policy: str, nth: int) -> Config:
    return make_config(
        {
            "doomed": {"address": doomed.address, "timeout": 5, "onFailure": policy},
            "faulty": {"address": faulty.address, "timeout": 5},
        },
        output_processors=[{"processor": "doomed/exiter", "options": {"nth": nth}}, "faulty/counter"],
        responses=[{"text": "one two three four"}],
    )


def assert_killed(doomed: SidecarProcess) -> None:
    assert doomed.proc is not None
    assert doomed.proc.wait(5) == 1, "the exiter did not kill its sidecar"


async def test_killed_sidecar_fail_closed_stream(doomed: SidecarProcess, faulty: Faulty) -> None:
    async with App(killed_config(doomed, faulty, "fail-closed", nth=2)) as app:
        chunks, result = await collect(app)
        assert let_through(app, "exiter", "process_output_stream") == 0
    assert_killed(doomed)
    assert_error_ending(chunks, result, "exiter", "process_output_stream")
    assert "data-count" in {c["type"] for c in chunks}  # processOutputResult still ran (finalization)


async def test_killed_sidecar_fail_closed_generate(doomed: SidecarProcess, faulty: Faulty) -> None:
    # generate streams the answer as one delta, so the exiter dies on the first
    async with App(killed_config(doomed, faulty, "fail-closed", nth=1)) as app:
        with pytest.raises(ProcessorFailedError) as info:
            await app.agent("a").generate("hi")
    assert_killed(doomed)
    assert (info.value.processor_id, info.value.hook) == ("exiter", "process_output_stream")
    assert_names(str(info.value), "exiter", "process_output_stream")


async def test_killed_sidecar_fail_open_stream_completes(doomed: SidecarProcess, faulty: Faulty) -> None:
    async with App(killed_config(doomed, faulty, "fail-open", nth=2)) as app:
        chunks, result = await collect(app)
        assert let_through(app, "exiter", "process_output_stream") == 1
    assert_killed(doomed)
    assert result.error is None
    assert result.finish_reason == "stop"
    assert result.text == "one two three four"
    assert [c["type"] for c in chunks][-1] == "finish"
    assert [c["data"] for c in chunks if c["type"] == "data-count"] == [{"deltas": 4}]
