"""PROCMESH_API_KEYS and PROCMESH_TRUSTED_CONTEXT: what each entry means, and every mistake refused
at start-up naming the entry by its position (never the key)."""

from __future__ import annotations

import logging

import pytest
from pydantic import SecretStr

from procmesh_orchestrator.service._auth import (
    ANONYMOUS,
    ApiKeys,
    Caller,
    KeyListError,
    RepeatedAuthorizationError,
    parse_keys,
)
from procmesh_orchestrator.service._errors import AuthenticationError, BadRequestError, ForbiddenError
from procmesh_orchestrator.service._trust import ContextTrust, TrustedContextError
from procmesh_orchestrator.settings import OrchestratorSettings

SECRET = "s3cr3t-k3y"


def keys_from_env(monkeypatch: pytest.MonkeyPatch, value: str) -> list[str]:
    """The entries OrchestratorSettings reads from PROCMESH_API_KEYS."""
    monkeypatch.setenv("PROCMESH_API_KEYS", value)
    return [k.get_secret_value() for k in OrchestratorSettings().api_keys]


def test_every_entry_is_a_tenant_an_operator_or_a_gateway_key() -> None:
    entries = parse_keys(["k-ada=user-ada", "k-op=@operator", "k-gw=@gateway", "c2VjcmV0==user-1"])
    assert [(e.key, e.caller) for e in entries] == [
        ("k-ada", Caller("key-1", "user-ada", frozenset())),
        ("k-op", Caller("key-2", None, frozenset({"operator"}))),
        ("k-gw", Caller("key-3", None, frozenset({"gateway"}))),
        ("c2VjcmV0=", Caller("key-4", "user-1", frozenset())),  # split at the last '=' only
    ]


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["k1=t1", "k1=t2"], "PROCMESH_API_KEYS entry 2 repeats the key of entry 1"),
        (["k1=t1", "k2=t2", SECRET], "PROCMESH_API_KEYS entry 3 is bound to nothing: bind it to a resource"),
        (["c2VjcmV0=="], "PROCMESH_API_KEYS entry 1 is bound to nothing"),  # base64 padding binds nothing
        (["k1=t1", ""], "PROCMESH_API_KEYS entry 2 is empty"),
        ([f"{SECRET}=t1 k2=t2"], "PROCMESH_API_KEYS entry 1 holds whitespace or ';'"),
        ([f"{SECRET}=t1;k2=t2"], "PROCMESH_API_KEYS entry 1 holds whitespace or ';'"),
        (["k1=t1", f"{SECRET}=@admin"], "PROCMESH_API_KEYS entry 2: unknown role '@admin'"),
        ([f"{SECRET}=" + "r" * 300], "PROCMESH_API_KEYS entry 1: the resource a key is bound to must be"),
    ],
)
def test_a_key_list_mistake_is_a_start_up_error_naming_the_entry(entries: list[str], message: str) -> None:
    with pytest.raises(KeyListError) as error:
        ApiKeys([SecretStr(e) for e in entries])
    assert str(error.value).startswith(message)
    assert SECRET not in str(error.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("k1=t1; k2=t2", "entry 1 holds whitespace or ';'"),  # was one key 'k1=t1; k2' bound to 't2'
        ("k1=t1 k2=t2", "entry 1 holds whitespace or ';'"),
        ("k1=t1,,k2=t2", "entry 2 is empty"),
        ("k1=t1,k2=t2,", "entry 3 is empty"),
        ("k1=t1,k1=t2", "entry 2 repeats the key of entry 1"),  # k1 acted as t2
        ("k1=t1,k2=t2,k1", "entry 3 is bound to nothing"),  # k1 became unbound
        ('["k1=t1", "k2"]', "entry 2 is bound to nothing"),
    ],
)
def test_the_environment_list_is_read_as_written(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    entries = keys_from_env(monkeypatch, value)
    with pytest.raises(KeyListError, match=message):
        parse_keys(entries)


def test_spaces_around_the_commas_are_no_mistake(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = keys_from_env(monkeypatch, " k1=t1 , k2=@operator ")
    assert [e.key for e in parse_keys(entries)] == ["k1", "k2"]
    assert keys_from_env(monkeypatch, "") == []


def test_identify_says_who_calls_and_refuses_a_header_given_twice() -> None:
    keys = ApiKeys([SecretStr("k-ada=user-ada"), SecretStr("k-op=@operator")])
    assert keys.identify("Bearer k-ada") == Caller("key-1", "user-ada", frozenset())
    assert keys.identify(["Bearer k-op"]).operator
    with pytest.raises(RepeatedAuthorizationError, match="given more than once") as twice:
        keys.identify(["Bearer k-ada", "Bearer k-op"])
    assert twice.value.http_status == 400
    for wrong in (None, "Bearer nope", "Basic k-ada", []):
        with pytest.raises(AuthenticationError):
            keys.identify(wrong)
    assert ApiKeys([]).identify(None) is ANONYMOUS


def test_a_gateway_key_runs_no_agent_and_sees_nothing() -> None:
    gateway = Caller("key-1", None, frozenset({"gateway"}))
    with pytest.raises(ForbiddenError, match="gateway role"):
        gateway.check_runs_agents()
    assert not gateway.may_see("user-ada")
    assert not gateway.may_see("")
    tenant = Caller("key-2", "user-ada", frozenset())
    tenant.check_runs_agents()
    assert tenant.may_see("user-ada")
    assert not tenant.may_see("user-bob")
    assert not tenant.may_see("")
    assert ANONYMOUS.may_see("user-bob")


def test_the_sidecar_key_is_made_for_this_process_with_the_gateway_role_only() -> None:
    keys = ApiKeys([SecretStr("k-ada=user-ada")])
    made = keys.sidecar_key()
    assert made is not None
    assert made == keys.sidecar_key()
    assert keys.identify(f"Bearer {made}").roles == frozenset({"gateway"})
    assert [c.key_id for c in keys.callers()] == ["key-1"]
    assert ApiKeys([]).sidecar_key() is None


TENANTS = [Caller("key-1", "tenant-a", frozenset()), Caller("key-2", "tenant-b", frozenset())]
OPERATOR = Caller("key-3", None, frozenset({"operator"}))


def test_trust_is_per_key_and_reserved_keys_never_come_from_a_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    trust = ContextTrust.of({"tenant-a": ["tier"], "@operator": ["*"]}, [*TENANTS, OPERATOR], legacy=False)
    a, b = TENANTS
    assert trust.check(a, {"tier": "gold"}) == {"tier": "gold"}
    with pytest.raises(BadRequestError, match=r"requestContext: this API key may not send 'tier'"):
        trust.check(b, {"tier": "gold"})
    assert trust.check(OPERATOR, {"region": "eu", "tier": "x"}) == {"region": "eu", "tier": "x"}
    for caller in (a, b, OPERATOR):
        for reserved in ("responseCache", "mastra__resourceId", "threadId", "resourceId"):
            with pytest.raises(BadRequestError, match=f"'{reserved}' reserved"):
                trust.check(caller, {reserved: {"scope": "tenant-a"}})
    assert trust.check(b, {}) == {}
    assert trust.check(b, None) == {}
    with caplog.at_level(logging.WARNING, logger="procmesh_orchestrator.service._trust"):
        legacy = ContextTrust.of({}, TENANTS, legacy=True)
    assert "PROCMESH_TRUST_REQUEST_CONTEXT is deprecated" in caplog.text
    assert legacy.check(b, {"anything": 1}) == {"anything": 1}
    with pytest.raises(BadRequestError, match="'responseCache' reserved"):
        legacy.check(b, {"responseCache": {"scope": "tenant-a"}})


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"tenant-x": ["tier"]}, "PROCMESH_TRUSTED_CONTEXT entry 'tenant-x': no key of PROCMESH_API_KEYS"),
        ({"@admin": ["tier"]}, "PROCMESH_TRUSTED_CONTEXT entry '@admin': unknown role"),
        ({"@gateway": ["tier"]}, "PROCMESH_TRUSTED_CONTEXT entry '@gateway': a @gateway key runs no agent"),
        (
            {"tenant-a": ["responseCache"]},
            "PROCMESH_TRUSTED_CONTEXT entry 'tenant-a': 'responseCache' reserved",
        ),
        ({"*": ["mastra__threadId"]}, "PROCMESH_TRUSTED_CONTEXT entry '*': 'mastra__threadId' reserved"),
        ({"tenant-a": [""]}, "PROCMESH_TRUSTED_CONTEXT entry 'tenant-a': an empty key name"),
    ],
)
def test_a_trusted_context_mistake_is_a_start_up_error_naming_the_entry(
    setting: dict[str, list[str]], message: str
) -> None:
    with pytest.raises(TrustedContextError) as error:
        ContextTrust.of(setting, TENANTS, legacy=False)
    assert str(error.value).startswith(message)


def test_the_trusted_context_setting_is_json_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROCMESH_TRUSTED_CONTEXT", '{"tenant-a": ["tier"], "*": ["locale"]}')
    settings = OrchestratorSettings()
    assert settings.trusted_context == {"tenant-a": ["tier"], "*": ["locale"]}
    trust = ContextTrust.of(settings.trusted_context, TENANTS, legacy=False)
    assert trust.allowed(TENANTS[0]) == {"tier", "locale"}
    assert trust.allowed(TENANTS[1]) == {"locale"}
