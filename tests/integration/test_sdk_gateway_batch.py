"""`Model.generate` calls a hook makes at once go in one ``ModelService.GenerateBatch``
(`procmesh._model_batch`): each caller gets its own answer or its own error, whatever order the
gateway answers in; one call alone is a Generate; a gateway without GenerateBatch (an older
orchestrator) is sent the calls one by one. A real grpc.aio server plays the gateway on 127.0.0.1
and records what it is sent; the real orchestrator's GenerateBatch is tested end to end in
tests/e2e/gateway/test_gateway_batch.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio

from procmesh import _model
from procmesh.v1 import model_pb2 as mpb
from procmesh.v1 import model_pb2_grpc as mgrpc
from tests.integration.fake_gateway import serve_gateway


def _echo(request: mpb.ModelServiceGenerateRequest) -> mpb.ModelServiceGenerateResponse:
    return mpb.ModelServiceGenerateResponse(text=f"seen: {request.messages[-1].text}", model=request.model)


class _Gateway(mgrpc.ModelServiceServicer):
    """Answers every call with the text it was asked about; a batch in reverse order, a model named
    ``missing`` with NOT_FOUND."""

    def __init__(self) -> None:
        self.generates: list[str] = []
        self.batches: list[list[tuple[str, float]]] = []
        self.batch_deadlines: list[float | None] = []

    async def Generate(self, request: Any, context: Any) -> mpb.ModelServiceGenerateResponse:
        self.generates.append(request.messages[-1].text)
        if request.model == "missing":
            await context.abort(grpc.StatusCode.NOT_FOUND, "model 'missing' is not in the config")
        return _echo(request)

    async def GenerateBatch(
        self, request: Any, context: Any
    ) -> AsyncIterator[mpb.ModelServiceGenerateBatchResponse]:
        self.batches.append([(i.request.messages[-1].text, i.timeout_seconds) for i in request.items])
        self.batch_deadlines.append(context.time_remaining())
        for index in reversed(range(len(request.items))):
            item = request.items[index].request
            if item.model == "missing":
                yield mpb.ModelServiceGenerateBatchResponse(
                    index=index,
                    code=grpc.StatusCode.NOT_FOUND.value[0],
                    message="model 'missing' is not in the config",
                )
            else:
                yield mpb.ModelServiceGenerateBatchResponse(index=index, response=_echo(item))


class _OldGateway(_Gateway):
    """An orchestrator from before GenerateBatch: the servicer's default answers UNIMPLEMENTED."""

    GenerateBatch = mgrpc.ModelServiceServicer.GenerateBatch  # type: ignore[assignment]


@pytest_asyncio.fixture
async def gateway() -> AsyncIterator[_Gateway]:
    async for servicer in serve_gateway(_Gateway()):
        yield servicer


@pytest_asyncio.fixture
async def old_gateway() -> AsyncIterator[_Gateway]:
    async for servicer in serve_gateway(_OldGateway()):
        yield servicer


def _ask(ref: str, text: str, timeout: float | None = None) -> Any:
    return _model.Model(ref, "moderation", "run-1").generate(text, timeout=timeout)


async def test_calls_made_at_once_go_in_one_batch_and_each_gets_its_own_answer(gateway: _Gateway) -> None:
    texts = [f"message {i}" for i in range(5)]
    answers = await asyncio.gather(*(_ask("judge", t) for t in texts))
    assert [a.text for a in answers] == [f"seen: {t}" for t in texts]  # answered in reverse order
    assert gateway.generates == []
    assert [[text for text, _ in batch] for batch in gateway.batches] == [texts]


async def test_one_call_of_a_batch_fails_alone_with_the_status_generate_would_give(gateway: _Gateway) -> None:
    results: list[Any] = await asyncio.gather(
        _ask("judge", "a"), _ask("missing", "b"), _ask("judge", "c"), return_exceptions=True
    )
    ok, missing, other = results
    assert isinstance(missing, _model.ModelError)
    assert missing.status == grpc.StatusCode.NOT_FOUND
    assert (
        str(missing) == "model gateway: 'missing' failed with NOT_FOUND: model 'missing' is not in the config"
    )
    assert [ok.text, other.text] == ["seen: a", "seen: c"]
    alone = await asyncio.gather(_ask("missing", "d"), return_exceptions=True)  # the same call as a Generate
    assert str(alone[0]) == str(missing)
    assert gateway.generates == ["d"]


async def test_each_call_keeps_its_own_deadline_and_the_batch_has_the_longest(gateway: _Gateway) -> None:
    await asyncio.gather(_ask("judge", "short", timeout=2.0), _ask("judge", "long", timeout=9.0))
    [[(_, short), (_, long)]] = gateway.batches
    assert short == pytest.approx(2.0, abs=0.1)
    assert long == pytest.approx(9.0, abs=0.1)
    deadline = gateway.batch_deadlines[0]
    assert deadline is not None
    assert deadline == pytest.approx(9.0, abs=0.5)  # the longest, not the shortest (2 s)


async def test_a_call_alone_is_a_generate(gateway: _Gateway) -> None:
    assert (await _ask("judge", "alone")).text == "seen: alone"
    await _ask("judge", "later")  # not made at once with the first: a call of its own too
    assert gateway.generates == ["alone", "later"]
    assert gateway.batches == []


async def test_a_gateway_without_generate_batch_is_sent_the_calls_one_by_one(old_gateway: _Gateway) -> None:
    answers = await asyncio.gather(*(_ask("judge", f"m{i}") for i in range(3)))
    assert [a.text for a in answers] == ["seen: m0", "seen: m1", "seen: m2"]
    assert sorted(old_gateway.generates) == ["m0", "m1", "m2"]
    await asyncio.gather(*(_ask("judge", f"n{i}") for i in range(2)))  # no second try of the batch
    assert sorted(old_gateway.generates[3:]) == ["n0", "n1"]
