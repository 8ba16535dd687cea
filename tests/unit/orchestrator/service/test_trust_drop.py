"""ContextTrust in drop mode, without sockets: what `admit` drops and `check` still refuses, and
the header value a caller's key names cannot break."""

from __future__ import annotations

import pytest

from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import BadRequestError
from procmesh_orchestrator.service._trust import ContextTrust, dropped_header

ACME = Caller(key_id="key-1", resource="acme", roles=frozenset())


def _trust(*, drop: bool) -> ContextTrust:
    return ContextTrust.of({"acme": ["tenant"]}, [ACME], legacy=False, drop=drop)


def test_admit_drops_in_drop_mode_and_refuses_otherwise() -> None:
    context = {"tenant": "acme", "tier": "gold", "debug": True}
    assert _trust(drop=True).admit(ACME, context) == ({"tenant": "acme"}, ["debug", "tier"])
    with pytest.raises(BadRequestError, match="may not send 'debug', 'tier'"):
        _trust(drop=False).admit(ACME, context)


def test_check_refuses_in_either_mode() -> None:
    # routes whose response could not name a dropped key (resume, catalog, memory) use check
    with pytest.raises(BadRequestError, match="may not send 'tier'"):
        _trust(drop=True).check(ACME, {"tier": "gold"})


def test_reserved_keys_are_refused_in_drop_mode() -> None:
    with pytest.raises(BadRequestError, match="'threadId' reserved"):
        _trust(drop=True).admit(ACME, {"tenant": "acme", "threadId": "t"})


def test_the_header_is_ascii_and_bounded() -> None:
    assert dropped_header(["a,b", "caf\u00e9", "x\r\ny"]) == "a%2Cb, caf%C3%A9, x%0D%0Ay"
    keys = [f"k{i:02}" for i in range(40)]
    assert dropped_header(keys) == ", ".join(keys[:32]) + ", +8"
