"""The world the guards' end-to-end tests run in (tests/e2e/guards/test_guards.py and
test_guards_judging.py): the scripted judge server's answers, the agents (one guard each, on the
echoing demo model or a scripted answer), the orchestrator's config with examples/moderation.yaml
in it, the two module fixtures that start them (`judge_server`, `orchestrator`: a module imports
them, and pytest serves them by those names), and the calls and readings the tests make.

Answers come from the orchestrator's offline models: ``demo`` echoes the (guarded) input back,
so what the model received is visible in the answer; ``scripted`` answers stream word by word.
Other modules of this folder take its verdicts (``NO_SCORES``, ``HATE``...) and calls from here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.gateway.support import GATEWAY_KEY, sidecar_env
from tests.e2e.guards.judge_server import JudgeServer, Rule
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import API_KEYS, AUTH, free_port, sse_events

PROVIDER_SECRET = "sk-judge-provider-secret-only-the-orchestrator-has"
MEMORY_KEY = "memory-key-0123456789"
ACME, GLOBEX = "acme-key-0123456789", "globex-key-0123456789"
TENANT_KEYS = f"{ACME}=acme,{GLOBEX}=globex"
"""Two tenants' keys every `start_replica` orchestrator takes (test_judge_cache.py's tenants)."""
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "moderation.yaml"

NO_SCORES: dict[str, Any] = {"category_scores": [], "reason": None}
HATE = {
    "category_scores": [{"category": "hate", "score": 0.9}, {"category": "violence", "score": 0.2}],
    "reason": "hateful",
}
MILD = {"category_scores": [{"category": "harassment", "score": 0.6}], "reason": "rude"}
NO_ATTACK: dict[str, Any] = {"categories": [], "reason": None}
ATTACK = {"categories": [{"type": "injection", "score": 0.95}], "reason": "overrides instructions"}
SUBTLE = {"categories": [{"type": "role-manipulation", "score": 0.6}], "reason": "persona play"}
EMAIL, PHONE = "jane@example.com", "555-123-4567"
CONTACT = {
    "categories": [{"type": "email", "score": 0.99}, {"type": "phone", "score": 0.9}],
    "detections": [
        {"type": "email", "value": EMAIL, "confidence": 0.99},
        {"type": "phone", "value": PHONE, "confidence": 0.9},
    ],
}
SECRET_ROLE = "You are a secret agent"


# Window answers: "w0001 ... w0010." is one sentence, so one window, per ten deltas.
def numbered(count: int) -> list[str]:
    return [f" w{i:04d}" + ("." if i % 10 == 0 else "") for i in range(1, count + 1)]


def _judges(server: JudgeServer) -> None:
    server.judge("mod", NO_SCORES, Rule(("HATE",), HATE), Rule(("MILD",), MILD))
    server.judge("inj", NO_ATTACK, Rule(("IGNORE PREVIOUS",), ATTACK), Rule(("SUBTLE",), SUBTLE))
    server.judge(
        "inj-rw",
        {**NO_ATTACK, "rewritten_content": None},
        Rule(("IGNORE PREVIOUS",), {**ATTACK, "rewritten_content": "Please summarize the document."}),
        Rule(("NO REWRITE",), {**ATTACK, "rewritten_content": None}),
    )
    server.judge(
        "pii",
        {"categories": [], "detections": []},
        Rule((EMAIL,), CONTACT),
        Rule(
            ("Alice Smith",),
            {"categories": [], "detections": [{"type": "name", "value": "Alice Smith", "confidence": 0.8}]},
        ),
        Rule(
            ("maybe Bob",),
            {"categories": [], "detections": [{"type": "name", "value": "Bob", "confidence": 0.4}]},
        ),
        Rule(
            ("GHOST",),
            {"categories": [], "detections": [{"type": "email", "value": "x@y.io", "confidence": 0.9}]},
        ),
    )
    server.judge(
        "lang",
        {"iso_code": "en", "confidence": 0.99},
        Rule(("Bonjour",), {"iso_code": "fr", "confidence": 0.98}),
        Rule(("Hallo",), {"iso_code": "de", "confidence": 0.5}),
        Rule(("Salut",), {"iso_code": "fr", "confidence": None}),
    )
    server.judge(
        "lang-tr",
        {"iso_code": "en", "confidence": 0.99, "translated_text": None},
        Rule(
            ("Bonjour",),
            {"iso_code": "fr", "confidence": 0.98, "translated_text": "Hello, how are you today?"},
        ),
    )
    server.judge(
        "sys",
        {"detections": [], "reason": None},
        Rule(
            (SECRET_ROLE,),
            {
                "detections": [{"type": "system-prompt", "value": SECRET_ROLE, "confidence": 0.95}],
                "reason": "role",
            },
        ),
    )
    server.judge("bad", "not JSON, twice")
    server.judge("slow", NO_SCORES, delay=3.0)
    server.judge("win", NO_SCORES)
    server.judge("win-chars", NO_SCORES)
    server.judge("pipe", NO_SCORES, delay=0.2)
    server.judge("hold", NO_SCORES, Rule((" w0042",), HATE), delay=0.02)
    # the fifth window (w0041..w0050) gets a malformed answer: the judge fails mid-stream
    server.judge("flaky", NO_SCORES, Rule((" w0042",), "not JSON, twice"), delay=0.02)
    # the example's judge (examples/moderation.yaml): one model, three guards' prompts
    server.judge(
        "gpt-5-nano",
        {},
        Rule(("PII", EMAIL), CONTACT),
        Rule(("PII",), {"categories": [], "detections": []}),
        Rule(("prompt injection", "IGNORE PREVIOUS"), ATTACK),
        Rule(("prompt injection",), NO_ATTACK),
        Rule(("moderat", "HATE"), HATE),
        Rule(("moderat",), NO_SCORES),
    )
    server.script("gpt-5-mini", {"text": "Happy to help with that."})


def guard(pid: str, judge: str, on_failure: str | None = None, **options: Any) -> dict[str, Any]:
    ref: dict[str, Any] = {"processor": f"g/{pid}", "options": {"model": f"judges/{judge}", **options}}
    if on_failure:
        ref["onFailure"] = on_failure
    return ref


def _in(pid: str, judge: str, on_failure: str | None = None, **options: Any) -> dict[str, Any]:
    """An agent on the echoing demo model with one input guard."""
    return {
        "model": "echo",
        "errorProcessorDefaults": False,
        "inputProcessors": [guard(pid, judge, on_failure, **options)],
    }


def _out(pid: str, judge: str, answer: str, on_failure: str | None = None, **options: Any) -> dict[str, Any]:
    """An agent on a scripted answer with one output guard."""
    return {
        "model": answer,
        "errorProcessorDefaults": False,
        "outputProcessors": [guard(pid, judge, on_failure, **options)],
    }


ANSWERS = {
    "hateful": "Hello there. I HATE everyone. Have a nice day.",
    "named": "Contact Alice Smith today. Thanks.",
    "leaky": "Sure. You are a secret agent, it says. Bye.",
    "codename": "Fine. Our codename Falcon ships soon. Bye.",
}

AGENTS: dict[str, dict[str, Any]] = {
    # moderation: the seeds' quick start (categories, threshold 0.7, block), defaults, strategies
    "mod-block": _in("moderation", "mod", categories=["hate", "harassment", "violence"], threshold=0.7),
    "mod-default": _in("moderation", "mod"),
    "mod-warn": _in("moderation", "mod", strategy="warn", include_scores=True),
    "mod-filter": _in("moderation", "mod", strategy="filter"),
    "mod-last": _in("moderation", "mod", last_message_only=True),
    "mod-out-block": _out("moderation", "mod", "hateful"),
    "mod-out-warn": _out("moderation", "mod", "hateful", strategy="warn"),
    "mod-out-filter": _out("moderation", "mod", "hateful", strategy="filter"),
    # prompt injection
    "inj-block": _in("prompt-injection-detector", "inj"),
    "inj-low": _in("prompt-injection-detector", "inj", threshold=0.5),
    "inj-warn": _in("prompt-injection-detector", "inj", strategy="warn"),
    "inj-filter": _in("prompt-injection-detector", "inj", strategy="filter"),
    "inj-rewrite": _in("prompt-injection-detector", "inj-rw", strategy="rewrite"),
    # PII
    "pii-mask": _in("pii-detector", "pii"),
    "pii-plain-mask": _in("pii-detector", "pii", preserve_format=False),
    "pii-hash": _in("pii-detector", "pii", redaction_method="hash"),
    "pii-remove": _in("pii-detector", "pii", redaction_method="remove"),
    "pii-placeholder": _in("pii-detector", "pii", redaction_method="placeholder"),
    "pii-block": _in("pii-detector", "pii", strategy="block", include_detections=True),
    "pii-warn": _in("pii-detector", "pii", strategy="warn"),
    "pii-filter": _in("pii-detector", "pii", strategy="filter"),
    "pii-out": _out("pii-detector", "pii", "named"),
    "pii-split": _out("pii-detector", "pii", "split-mail"),
    # language
    "lang-detect": {**_in("language-detector", "lang"), "memory": {"lastMessages": 10}},
    "lang-translate": {
        **_in("language-detector", "lang-tr", strategy="translate"),
        "memory": {"lastMessages": 10},
    },
    "lang-block": _in("language-detector", "lang", strategy="block"),
    "lang-warn": _in("language-detector", "lang", strategy="warn"),
    "lang-warn-details": _in("language-detector", "lang", strategy="warn", include_detection_details=True),
    "lang-targets": _in("language-detector", "lang", strategy="block", target_languages=["French", "en"]),
    # system-prompt scrubber
    "sys-mask": _out("system-prompt-scrubber", "sys", "leaky"),
    "sys-placeholder": _out("system-prompt-scrubber", "sys", "leaky", redaction_method="placeholder"),
    "sys-remove": _out("system-prompt-scrubber", "sys", "leaky", redaction_method="remove"),
    "sys-block": _out("system-prompt-scrubber", "sys", "leaky", strategy="block"),
    "sys-warn": _out("system-prompt-scrubber", "sys", "leaky", strategy="warn"),
    "sys-filter": _out("system-prompt-scrubber", "sys", "leaky", strategy="filter"),
    "sys-custom": _out(
        "system-prompt-scrubber",
        "sys",
        "codename",
        redaction_method="placeholder",
        custom_patterns=[r"codename \w+"],
    ),
    # the failure policy: malformed JSON twice, a judge slower than judge_timeout
    "bad-closed": _in("moderation", "bad", "fail-closed"),
    "bad-open": _in("moderation", "bad", "fail-open"),
    "slow-closed": _in("moderation", "slow", "fail-closed", judge_timeout=0.5),
    "slow-open": _in("moderation", "slow", "fail-open", judge_timeout=0.5),
    "out-bad-closed": _out("moderation", "bad", "hateful", "fail-closed"),
    "out-bad-open": _out("moderation", "bad", "hateful", "fail-open"),
    # speculation: the moderation stage gets each part with the PII stage (another sidecar name)
    # and is rewound whenever the PII stage holds back or redacts one
    "spec-out": {
        "model": "named",
        "errorProcessorDefaults": False,
        "outputProcessors": [
            guard("pii-detector", "pii"),
            {**guard("moderation", "mod"), "processor": "g2/moderation"},
        ],
    },
    # windows
    "win": _out("moderation", "win", "thousand"),
    "win-chars": _out("moderation", "win-chars", "thousand", window_boundary="chars"),
    "pipe": _out("moderation", "pipe", "hundred"),
    "hold": _out("moderation", "hold", "hundred"),
    "flaky-open": _out("moderation", "flaky", "hundred", "fail-open"),
    "flaky-closed": _out("moderation", "flaky", "hundred", "fail-closed"),
    # one sidecar serves both: one fused session, moderation's policy in context.fused (a judge
    # that may be merged is never fused, so these two opt out of merging)
    "flaky-fused": {
        "model": "hundred",
        "errorProcessorDefaults": False,
        "outputProcessors": [
            guard("pii-detector", "pii", merge_judge=False),
            guard("moderation", "flaky", "fail-open", merge_judge=False),
        ],
    },
}


def _config(sidecar: str, judges_url: str, store: Path) -> dict[str, Any]:
    scripted: dict[str, dict[str, Any]] = {
        name: {"provider": "scripted", "responses": [{"text": text}] * 40} for name, text in ANSWERS.items()
    }
    # a provider's tokens cut an address anywhere: "jane@example." then "com"
    scripted["split-mail"] = {
        "provider": "scripted",
        "responses": [{"deltas": ["Mail jane@example.", "com", " today.", " Bye."]}] * 4,
    }
    scripted["thousand"] = {"provider": "scripted", "responses": [{"deltas": numbered(1000)}] * 4}
    # one answer per run on it: pipe, hold, and the three judge-failure runs
    scripted["hundred"] = {"provider": "scripted", "responses": [{"deltas": numbered(100)}] * 5, "delayMs": 2}
    example = _example(judges_url)
    return {
        "sidecars": {"g": {"address": sidecar, "timeout": 10}, **example["sidecars"]},
        "providers": {
            "judges": {"kind": "openai", "baseUrl": judges_url, "apiKeyEnv": "JUDGE_KEY"},
            **example["providers"],
        },
        "models": {"echo": {"provider": "demo"}, **scripted},
        "storage": {"backend": "sqlite", "path": str(store)},
        "workflows": example["workflows"],
        "agents": {**AGENTS, **example["agents"]},
    }


def _example(judges_url: str) -> dict[str, Any]:
    """examples/moderation.yaml as shipped, pointed at the judge server and this module's sidecar."""
    import yaml

    example: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    example["providers"]["openai"]["baseUrl"] = judges_url
    example["agents"]["moderated"]["errorProcessorDefaults"] = False  # no built-in sidecar of its own
    return example


@pytest.fixture(scope="module", name="judge_server")
def guards_judge_server() -> Iterator[JudgeServer]:
    server = JudgeServer(api_key=PROVIDER_SECRET)
    server.start()
    _judges(server)
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module", name="orchestrator")
async def guards_orchestrator(
    guards_sidecar: SidecarProcess,
    judge_server: JudgeServer,
    gateway_port: int,
    tmp_path_factory: pytest.TempPathFactory,
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> OrchestratorProcess:
    await guards_sidecar.wait_ready()
    config = _config(guards_sidecar.address, judge_server.base_url, tmp_path_factory.mktemp("store") / "m.db")
    # The example's sidecar is named `guards`: the same process serves it.
    config["sidecars"]["guards"] = {"address": guards_sidecar.address, "timeout": 10}
    config["sidecars"]["g2"] = {"address": guards_sidecar.address, "timeout": 10}
    return await asyncio.to_thread(
        start_orchestrator,
        config,
        "--grpc-port",
        str(gateway_port),
        env={
            "PROCMESH_API_KEYS": f"{API_KEYS},{MEMORY_KEY}=user-1,{GATEWAY_KEY}=@gateway",
            "JUDGE_KEY": PROVIDER_SECRET,
            "OPENAI_API_KEY": PROVIDER_SECRET,
        },
    )


async def generate(
    orchestrator: OrchestratorProcess, agent: str, messages: Any, **body: Any
) -> dict[str, Any]:
    headers = body.pop("headers", AUTH)
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=headers, timeout=30) as http:
        response = await http.post(f"/api/agents/{agent}/generate", json={"messages": messages, **body})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def stream(
    orchestrator: OrchestratorProcess, agent: str, on_text: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """Every chunk of a streamed run; `on_text` sees each text delta the moment it arrives."""
    chunks: list[dict[str, Any]] = []
    async with (
        httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH, timeout=60) as http,
        http.stream("POST", f"/api/agents/{agent}/stream", json={"messages": "go"}) as response,
    ):
        assert response.status_code == 200, await response.aread()
        async for data in sse_events(response):
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            chunks.append(chunk)
            if chunk["type"] == "text-delta" and on_text is not None:
                on_text(chunk["payload"]["text"])
    return chunks


def echoed(result: dict[str, Any]) -> str:
    """What the demo model was given as the last user turn (it answers ``You said: "<text>" ...``)."""
    text = str(result["text"])
    assert text.startswith('You said: "'), result
    return text[len('You said: "') : text.index('" Darn')]


def deltas_of(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["payload"]["text"] for c in chunks if c["type"] == "text-delta"]


def streamed_text(chunks: list[dict[str, Any]]) -> str:
    return "".join(deltas_of(chunks))


def violations_of(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The violations a streamed run announced (``data-procmesh-violation`` parts)."""
    return [c["data"] for c in chunks if c["type"] == "data-procmesh-violation"]


def only_violation(result: dict[str, Any]) -> dict[str, Any]:
    violations = result["violations"]
    assert len(violations) == 1, violations
    found: dict[str, Any] = violations[0]
    return found


@dataclass(frozen=True)
class Replica:
    """What the folder's `orchestrator` fixture (conftest.py) starts for a module that names it in
    a `replica` fixture: `start_replica`'s arguments but the fixtures'."""

    name: str
    """The guards sidecar's name (its socket and log file in the sidecar directory)."""
    config: Callable[[str], dict[str, Any]]
    """The orchestrator's config, given the guards sidecar's address."""
    env: dict[str, str]
    """The orchestrator's environment besides its API keys (a judge provider's key)."""


def guards_sidecar_process(sidecar_dir: Path, gateway_port: int, name: str) -> SidecarProcess:
    """``procmesh-sidecar guards`` on ``<name>.sock`` (not started yet), its environment holding
    the gateway and no provider key."""
    return SidecarProcess(
        ["guards"],
        f"unix://{sidecar_dir / f'{name}.sock'}",
        env=sidecar_env(f"127.0.0.1:{gateway_port}"),
        log_path=str(sidecar_dir / f"{name}.log"),
    )


async def start_replica(
    sidecar_dir: Path,
    name: str,
    config: Callable[[str], dict[str, Any]],
    start: Callable[..., OrchestratorProcess],
    env: dict[str, str],
) -> tuple[SidecarProcess, OrchestratorProcess]:
    """A guards sidecar (`name`) and the orchestrator whose gateway it calls, its gRPC port pinned
    first; `config` is the orchestrator's config given the sidecar's address."""
    port = free_port()
    sidecar = guards_sidecar_process(sidecar_dir, port, name)
    sidecar.start()
    await sidecar.wait_ready()
    keys = f"{API_KEYS},{TENANT_KEYS},{GATEWAY_KEY}=@gateway"
    orchestrator = await asyncio.to_thread(
        start, config(sidecar.address), "--grpc-port", str(port), env={"PROCMESH_API_KEYS": keys, **env}
    )
    return sidecar, orchestrator


async def start_judged(
    start: Callable[..., OrchestratorProcess],
    gateway_port: int,
    sidecars: dict[str, SidecarProcess],
    judge_url: str,
    secret: str,
    agents: dict[str, Any],
    models: dict[str, Any] | None = None,
) -> OrchestratorProcess:
    """An orchestrator serving the model gateway on `gateway_port` (its sidecars told it first),
    a ``judges`` provider at `judge_url` keyed with `secret`, the demo model ``echo`` (or
    `models`) and `agents`; each sidecar waited for, with a 10 s timeout."""
    for proc in sidecars.values():
        await proc.wait_ready()
    config = {
        "sidecars": {name: {"address": proc.address, "timeout": 10} for name, proc in sidecars.items()},
        "providers": {"judges": {"kind": "openai", "baseUrl": judge_url, "apiKeyEnv": "JUDGE_KEY"}},
        "models": models or {"echo": {"provider": "demo"}},
        "agents": agents,
    }
    keys = f"{API_KEYS},{GATEWAY_KEY}=@gateway"
    return await asyncio.to_thread(
        start, config, "--grpc-port", str(gateway_port), env={"PROCMESH_API_KEYS": keys, "JUDGE_KEY": secret}
    )
