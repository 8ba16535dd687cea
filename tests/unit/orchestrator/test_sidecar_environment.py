"""What a sidecar the orchestrator starts inherits: its environment without the secrets, and the
model gateway (the e2e test, tests/e2e/guards/test_self_started_builtins.py, reads a real child's)."""

from __future__ import annotations

from procmesh_orchestrator.app import secret_variables
from procmesh_orchestrator.config.loading import parse_config
from procmesh_orchestrator.sidecar_process import ModelGateway, sidecar_environment

CONFIG = parse_config(
    {
        "providers": {
            "local": {"kind": "openai", "baseUrl": "http://127.0.0.1:1/v1", "apiKeyEnv": "LOCAL_TOKEN"}
        },
        "storage": {"backend": "postgres", "dsnEnv": "PG_DSN"},
        "durable": {"eventLog": {"backend": "redis", "urlEnv": "REDIS_URL"}},
        "judgeCache": {"enabled": True, "redis": {"urlEnv": "VERDICTS_URL"}},
        "agents": {"a": {"model": "local/m"}},
    }
)


def test_every_variable_the_config_reads_a_secret_from_is_a_secret() -> None:
    assert secret_variables(CONFIG) == {
        "LOCAL_TOKEN",
        "OPENAI_API_KEY",  # the built-in providers' variables, used without declaring them
        "ANTHROPIC_API_KEY",
        "PG_DSN",
        "REDIS_URL",
        "VERDICTS_URL",
        "PROCMESH_API_KEYS",
    }


def test_the_secrets_are_dropped_and_the_rest_kept() -> None:
    environ = {
        "PATH": "/usr/bin",
        "LOCAL_TOKEN": "t",
        "PG_DSN": "postgresql://u:pw@db/x",
        "REDIS_URL": "redis://:pw@r",
        "VERDICTS_URL": "redis://:pw@v",
        "PROCMESH_API_KEYS": "k1,k2=user",
        "GEMINI_API_KEY": "g",  # named like a key: dropped whatever the config says
        "PROCMESH_CONFIG__STORAGE__DSN": "postgresql://u:pw@db/y",
        "PROCMESH_LOG_LEVEL": "DEBUG",
    }
    env = sidecar_environment(environ, secret_variables(CONFIG), None)
    assert env == {"PATH": "/usr/bin", "PROCMESH_LOG_LEVEL": "DEBUG"}


def test_the_gateway_replaces_what_was_inherited() -> None:
    environ = {"PROCMESH_MODEL_GATEWAY": "elsewhere:1", "PROCMESH_MODEL_GATEWAY_KEY": "stale"}
    with_key = sidecar_environment(environ, set(), ModelGateway("unix:///run/o.sock", "k1"))
    assert with_key == {"PROCMESH_MODEL_GATEWAY": "unix:///run/o.sock", "PROCMESH_MODEL_GATEWAY_KEY": "k1"}
    # an orchestrator without API keys: the gateway asks for none, so no key is passed on
    assert sidecar_environment(environ, set(), ModelGateway("127.0.0.1:50050")) == {
        "PROCMESH_MODEL_GATEWAY": "127.0.0.1:50050"
    }


def test_a_gateway_key_never_shows_in_a_repr() -> None:
    assert "k1" not in repr(ModelGateway("127.0.0.1:50050", "k1"))
