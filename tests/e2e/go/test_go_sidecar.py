"""The Go example sidecar keeps the contract: `procmesh-check-sidecar` passes, reflection, drain.

The checker runs as the SDK's console script, as a Go author's CI would run it, with options per
processor (`--options ID=JSON`) so that both processors' aborts are provoked and their encoding
checked: shout aborts inside the 3-batch stream and right after the first part of the deadline
check, sends StreamEnd at once and ends its call on the half-close, as the contract asks (the
deadline check never half-closes, so its deadline ends that call).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.e2e.go.conftest import go_sidecar, run_go
from tests.e2e.node.conftest import wait_all
from tests.e2e.node.test_check_sidecar import assert_all_pass, check

pytestmark = pytest.mark.e2e

PROCESSORS = ["word-guard", "shout"]


def test_the_go_sidecar_passes_the_checker(go_address: str) -> None:
    outcome = check(go_address)
    assert_all_pass(outcome, PROCESSORS)
    assert outcome.has("PASS", "Describe: sdk procmesh-go-example/0.1.0")
    assert outcome.has("PASS", "malformed ProcessInput: message part of an unknown kind: OK, passed through")
    # Stock grpc-go answers a request it cannot parse INTERNAL; the contract allows it.
    assert outcome.has("PASS", "malformed ProcessInput: corrupt bytes: INTERNAL")
    assert outcome.has("PASS", "malformed ProcessOutputStream: corrupt bytes: INTERNAL")
    assert outcome.has("PASS", "malformed ProcessOutputStream: unknown processor: NOT_FOUND")
    assert outcome.has("PASS", "shout ProcessOutputStream: batches answered in order: 8 parts in 3 batches")
    assert outcome.has("PASS", "shout: state round-trip: 1 hook(s) return the whole state")
    # Without options neither processor has a word to act on.
    assert outcome.has("SKIP", "word-guard: abort/retry encoding")
    assert outcome.has("SKIP", "shout: abort/retry encoding")


def test_options_per_processor_provoke_both_aborts_and_an_early_stream_end_is_no_failure(
    go_address: str,
) -> None:
    # "weather" is the 4th word of the checker's text: shout aborts in the second batch and ends
    # its call on the half-close; "what" is in the deadline check's only part.
    for word in ("weather", "what"):
        outcome = check(
            go_address,
            "--options",
            'word-guard={"words": ["jailbreak"]}',
            "--options",
            f'shout={{"abortOn": ["{word}"]}}',
        )
        assert_all_pass(outcome, PROCESSORS)
        assert outcome.has(
            "PASS", "word-guard: abort/retry encoding: ProcessInput: reason 'blocked word: jailbreak'"
        )
        assert outcome.has(
            "PASS", f"shout: abort/retry encoding: ProcessOutputStream: reason 'shout will not say: {word}'"
        )
    assert outcome.has(
        "PASS",
        "shout: deadline respected: a stream left open past its 0.3s deadline (aborted at seq 1): "
        "DEADLINE_EXCEEDED",
    )
    assert outcome.has("PASS", "shout ProcessOutputStream: StreamEnd")


def test_options_are_validated_per_processor(go_address: str) -> None:
    # One shared options object cannot suit both processors: each refuses the other's key.
    shared = check(go_address, "--options", '{"words": ["x"]}')
    assert shared.code == 1
    assert shared.has("FAIL", "shout ProcessOutputStream: batches answered in order")
    assert 'invalid options for processor "shout": unknown keys ["words"]' in shared.stdout
    typo = check(go_address, "--options", "shuot={}")
    assert typo.code == 1
    assert typo.has("FAIL", "--options: 'shuot' is not hosted here")


def test_reflection_lists_the_services(go_address: str) -> None:
    async def services() -> list[str]:
        async with grpc.aio.insecure_channel(go_address) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            call = stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
            )
            async for resp in call:
                return [s.name for s in resp.list_services_response.service]
        return []

    names = asyncio.run(services())
    assert {"procmesh.v1.ProcessorService", "grpc.health.v1.Health"} <= set(names)


def test_sigterm_drains_and_exits_0_and_a_stray_argument_is_an_error(
    go_binary: Path, socket_dir: Path
) -> None:
    sock = socket_dir / "drain.sock"
    proc = go_sidecar(go_binary, f"unix://{sock}", socket_dir / "drain.log")
    wait_all([proc])
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.proc.wait(10) == 0
    assert not sock.exists()  # the socket is removed on the way out
    stray = run_go(go_binary, "--listen", "127.0.0.1:0", "extra")
    assert stray.returncode == 2
    assert 'unexpected argument "extra"' in stray.stderr
