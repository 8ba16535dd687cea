"""`procmesh-check-sidecar` passes both SDKs' sidecars and fails deliberately broken ones.

The checker runs as the SDK's installed console script, as CI would run it (the orchestrator's
`procmesh check-sidecar` alias is checked to give the same report); the sidecars are the
package's Node and Python example processes, and two processes of
tests/fixtures/broken_sidecar.py (a raw servicer that answers stream parts out of order, never
sends StreamEnd and skips request validation; one variant also dies on malformed input). The
fused-request and rewind checks run against tests/e2e/node/fusion_twins.{py,mjs} in both SDKs:
speculative processors that keep the contract, and `leaky`, which counts outside its state.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import BIN
from tests.e2e.node.conftest import HERE, Sidecars, node_sidecar, wait_all

pytestmark = pytest.mark.e2e

BROKEN = "tests.fixtures.broken_sidecar"


@dataclass(frozen=True)
class Outcome:
    """One checker run: exit code and the report lines by status."""

    code: int
    stdout: str

    def lines(self, status: str) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.startswith(status)]

    @property
    def summary(self) -> str:
        return self.stdout.strip().splitlines()[-1]

    def has(self, status: str, text: str) -> bool:
        return any(text in line for line in self.lines(status))


CHECKER = [str(BIN / "procmesh-check-sidecar")]
ALIAS = [str(BIN / "procmesh"), "check-sidecar"]


def check(address: str, *args: str, command: list[str] = CHECKER) -> Outcome:
    proc = subprocess.run(
        [*command, address, "--timeout", "3", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return Outcome(proc.returncode, proc.stdout)


@pytest.fixture(scope="module")
def broken(sidecars: Sidecars) -> Iterator[tuple[str, str]]:
    """(misbehaving, dying) broken sidecar addresses."""
    procs = [
        SidecarProcess(
            [],
            f"unix://{sidecars.dir / name}.sock",
            log_path=str(sidecars.dir / f"{name}.log"),
            module=BROKEN,
        )
        for name in ("broken", "dying")
    ]
    procs[1].args.append("--exit-on-malformed")
    for proc in procs:
        proc.start()
    try:
        wait_all(procs)
        yield procs[0].address, procs[1].address
    finally:
        for proc in procs:
            proc.stop(grace=1.0)


@contextlib.contextmanager
def fusion_set(kind: str) -> Iterator[None]:
    """Processes started inside serve this set of fusion_twins (FUSION_SET)."""
    os.environ["FUSION_SET"] = kind
    try:
        yield
    finally:
        del os.environ["FUSION_SET"]


@pytest.fixture(scope="module")
def fusion(sidecars: Sidecars) -> Iterator[dict[tuple[str, str], str]]:
    """Addresses by (sdk, set): the fusion twins ("good") and the leaky one, in each SDK."""
    procs: dict[tuple[str, str], SidecarProcess] = {}
    for kind in ("good", "leaky"):
        with fusion_set(kind):
            py = SidecarProcess(
                [], f"unix://{sidecars.dir / f'py-{kind}.sock'}", module="tests.e2e.node.fusion_twins"
            )
            py.start()
            procs[("python", kind)] = py
            procs[("node", kind)] = node_sidecar(
                HERE / "fusion_twins.mjs",
                f"unix://{sidecars.dir / f'node-{kind}.sock'}",
                sidecars.dir / "n.log",
            )
    try:
        wait_all(list(procs.values()))
        yield {key: proc.address for key, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.stop(grace=1.0)


def assert_all_pass(outcome: Outcome, processors: list[str]) -> None:
    assert outcome.code == 0, outcome.stdout
    assert not outcome.lines("FAIL"), outcome.stdout
    assert " passed, 0 failed, " in outcome.summary, outcome.summary
    for pid in processors:
        assert outcome.has("PASS", f"{pid}: deadline respected"), outcome.stdout
        assert outcome.has("PASS", f"{pid}: state round-trip"), outcome.stdout
        assert outcome.has("PASS", f"{pid}: undeclared hooks answer UNIMPLEMENTED"), outcome.stdout
    for text in ("health", "Describe", "still SERVING after malformed requests", "still SERVING at the end"):
        assert outcome.has("PASS", text), outcome.stdout


def test_the_python_sdk_sidecar_passes(sidecars: Sidecars) -> None:
    outcome = check(sidecars.python)
    assert_all_pass(outcome, ["pii-redactor", "topic-guard", "word-filter", "length-check", "word-counter"])
    assert outcome.has("PASS", "word-counter ProcessOutputStream: batches answered in order")
    # a pass-through: every text delta and the data part it does not take, in runs
    assert outcome.has("PASS", "word-counter ProcessOutputStream: unchanged runs: 8 of 8 parts"), (
        outcome.stdout
    )
    assert outcome.has("PASS", "malformed ProcessInput: message part of an unknown kind: OK, passed through")
    assert outcome.has("PASS", "malformed ProcessInput: corrupt bytes: INVALID_ARGUMENT")
    assert outcome.has("PASS", "malformed ProcessOutputStream: unknown processor: NOT_FOUND")
    # The probes made two of them abort; the encoding was checked.
    assert outcome.has("PASS", "topic-guard: abort/retry encoding: ProcessInput: reason")
    assert outcome.has("PASS", "length-check: abort/retry encoding: ProcessOutputStep: reason")
    assert outcome.has("SKIP", "word-filter: abort/retry encoding")


def test_the_node_sdk_sidecar_passes(sidecars: Sidecars) -> None:
    outcome = check(sidecars.node)
    assert_all_pass(outcome, ["stream-filter", "response-validator", "word-counter"])
    assert outcome.has("PASS", "Describe: sdk procmesh-node/")
    assert outcome.has("PASS", "stream-filter ProcessOutputStream: batches answered in order")
    assert outcome.has("PASS", "word-counter ProcessOutputStream: StreamEnd")
    assert outcome.has("PASS", "word-counter ProcessOutputStream: unchanged runs: 8 of 8 parts"), (
        outcome.stdout
    )
    assert outcome.has(
        "PASS", "malformed ProcessOutputStep: message part of an unknown kind: OK, passed through"
    )
    assert outcome.has("PASS", "malformed ProcessOutputStream: corrupt bytes: INVALID_ARGUMENT")
    assert outcome.has("PASS", "response-validator: abort/retry encoding: ProcessOutputStep: reason")
    assert outcome.has("PASS", "word-counter: state round-trip: 2 hook(s) return the whole state")


def test_one_processor_can_be_checked_alone(sidecars: Sidecars) -> None:
    outcome = check(sidecars.node, "--processor", "word-counter", "--options", "{}")
    assert outcome.code == 0, outcome.stdout
    assert outcome.has("PASS", "word-counter ProcessOutputResult: valid requests")
    assert "stream-filter ProcessOutputStream" not in outcome.stdout

    missing = check(sidecars.node, "--processor", "no-such-processor")
    assert missing.code == 1
    assert missing.has("FAIL", "--processor: 'no-such-processor' is not hosted here")


def test_the_orchestrator_alias_runs_the_same_checks(sidecars: Sidecars) -> None:
    args = ("--processor", "word-counter")
    direct, alias = check(sidecars.node, *args), check(sidecars.node, *args, command=ALIAS)
    assert alias.code == direct.code == 0, alias.stdout
    # Same checks, same verdicts (details such as timings may differ).
    assert alias.summary == direct.summary
    assert [line[:4] for line in alias.stdout.splitlines()] == [
        line[:4] for line in direct.stdout.splitlines()
    ]


def test_bad_options_are_a_usage_error() -> None:
    for command in (CHECKER, ALIAS):
        proc = subprocess.run(
            [*command, "127.0.0.1:1", "--options", "[1]"], capture_output=True, text=True, check=False
        )
        assert proc.returncode == 2, proc.stderr
        assert "--options must be a JSON object" in proc.stderr


def test_a_broken_sidecar_fails_with_the_broken_rules_named(broken: tuple[str, str]) -> None:
    outcome = check(broken[0])
    assert outcome.code == 1, outcome.stdout
    assert outcome.has(
        "FAIL", "malformed ProcessInput: empty processor_id: expected INVALID_ARGUMENT, got OK"
    )
    assert outcome.has("FAIL", "malformed ProcessInput: unknown processor: expected NOT_FOUND, got OK")
    assert outcome.has("FAIL", "message part of an unknown kind: expected OK (a part of a kind unknown here")
    assert "got UNKNOWN (looks like a crash)" in outcome.stdout
    assert outcome.has(
        "FAIL", "broken ProcessOutputStream: batches answered in order: result 1 carries seq 3"
    )
    assert outcome.has("FAIL", "broken ProcessOutputStream: StreamEnd: no StreamEnd after the half-close")
    assert outcome.has(
        "FAIL",
        "broken ProcessOutputStream: unchanged runs: seq 1 is in an unchanged run, but without the flag",
    ), outcome.stdout
    assert ", 0 failed, " not in outcome.summary


def test_a_sidecar_that_dies_on_malformed_input_fails_without_hanging(broken: tuple[str, str]) -> None:
    outcome = check(broken[1])
    assert outcome.code == 1, outcome.stdout
    assert outcome.has("FAIL", "message part of an unknown kind: expected OK")
    assert outcome.has(
        "FAIL",
        "malformed ProcessInput: corrupt bytes: expected INVALID_ARGUMENT or INTERNAL, got UNAVAILABLE",
    )
    assert outcome.has("FAIL", "still SERVING after malformed requests")
    assert outcome.has("FAIL", "sidecar reachable")


@pytest.mark.parametrize("sdk", ["python", "node"])
def test_speculative_processors_pass_the_fused_and_rewind_checks(
    fusion: dict[tuple[str, str], str], sdk: str
) -> None:
    outcome = check(fusion[(sdk, "good")])
    assert_all_pass(outcome, ["tally", "shout", "plain"])
    assert outcome.has("PASS", "Describe: sdk procmesh-"), outcome.stdout
    assert outcome.has("PASS", "; fuses; tally [ProcessInput, ProcessOutputStream] +data parts +speculative")
    for pid in ("tally", "shout"):
        assert outcome.has("PASS", f"{pid} ProcessOutputStream: rewinds restore the state"), outcome.stdout
    assert outcome.has("SKIP", "plain ProcessOutputStream: rewinds restore the state: not speculative")
    assert outcome.has(
        "PASS", "fused ProcessInput [tally, shout]: answers what the plain calls answer (both ran)"
    )
    assert outcome.has("PASS", "fused ProcessOutputStream [tally, shout]"), outcome.stdout
    assert outcome.has("PASS", "fused ProcessInput naming an unknown processor: NOT_FOUND")


@pytest.mark.parametrize("sdk", ["python", "node"])
def test_a_speculative_processor_that_a_rewind_cannot_undo_fails_the_rewind_check(
    fusion: dict[tuple[str, str], str], sdk: str
) -> None:
    outcome = check(fusion[(sdk, "leaky")])
    assert outcome.code == 1, outcome.stdout
    failed = outcome.lines("FAIL")
    rewind = [line for line in failed if "leaky ProcessOutputStream: rewinds restore the state" in line]
    assert rewind, outcome.stdout
    assert "after rewind_to 4, seq 5 answered" in rewind[0]
    assert "the final state" in rewind[0]
