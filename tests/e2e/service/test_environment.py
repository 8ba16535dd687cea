"""No PROCMESH_* variable is ignored silently, through the real processes: procmesh-orchestrator,
procmesh-sidecar, a Node SDK sidecar and the procmesh CLI exit with status 2 naming a variable no
procmesh component reads (and the closest known name) before serving; each starts with another
component's variable (a ConfigMap shared through envFrom) and names it in one INFO line; the
orchestrator also takes a PROCMESH_ variable its config names (`procmesh.environment`)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, NODE_SDK
from tests.deps import require, require_npm_packages
from tests.e2e.service.conftest import OrchestratorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

CONFIG = {
    "models": {"demo": {"provider": "demo"}},
    "agents": {"a": {"model": "demo", "errorProcessorDefaults": False}},
}
FOREIGN = "other procmesh components' settings"


def _environ(**extra: str) -> dict[str, str]:
    """This process's environment without its PROCMESH_ variables (the test names its own)."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("PROCMESH_")}, **extra}


def _refused(command: list[str], env: dict[str, str], cwd: Path | None = None) -> str:
    """Run `command` with `env`: it must exit 2 at once; its stderr."""
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, env=env, cwd=cwd)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    return proc.stderr


def _serves(command: list[str], env: dict[str, str]) -> str:
    """Start a sidecar with `env`, wait for its 'serving processors' line, SIGTERM it; its output."""
    lines = []
    with subprocess.Popen(
        command, stderr=subprocess.STDOUT, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True
    ) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                lines.append(line)
                if "serving processors" in line:
                    break
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    text = "".join(lines)
    assert "serving processors" in text, text
    return text


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG), encoding="utf-8")
    return path


async def test_the_orchestrator_refuses_a_misspelt_variable_naming_it(config_file: Path) -> None:
    command = [str(BIN / "procmesh-orchestrator"), "--config", str(config_file), "--http-port", "0"]
    err = await asyncio.to_thread(_refused, command, _environ(PROCMESH_API_KEY="key-ada"))
    assert "unknown environment variable PROCMESH_API_KEY (did you mean PROCMESH_API_KEYS?)" in err
    assert "serving" not in err
    # a misspelt config path: the missing --config error names the variable meant
    err = await asyncio.to_thread(
        _refused, [str(BIN / "procmesh-orchestrator")], _environ(PROCMESH_CONFIG_FIEL=str(config_file))
    )
    assert "--config FILE (or PROCMESH_CONFIG_FILE) is required" in err
    assert "PROCMESH_CONFIG_FIEL (did you mean PROCMESH_CONFIG_FILE?)" in err


async def test_the_orchestrator_starts_with_a_sidecars_variable_and_one_its_config_names(
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> None:
    config = {**CONFIG, "providers": {"cloud": {"kind": "openai", "apiKeyEnv": "PROCMESH_E2E_OPENAI_KEY"}}}
    env = {
        "PROCMESH_LISTEN": "127.0.0.1:1",
        "PROCMESH_HOOK_THREADS": "false",
        "PROCMESH_E2E_OPENAI_KEY": "sk-x",
    }
    orchestrator = await asyncio.to_thread(start_orchestrator, config, env=env)
    noted = [line for line in orchestrator.log().splitlines() if FOREIGN in line]
    assert len(noted) == 1, noted  # one line, naming each (the test's environment may add its own)
    assert "PROCMESH_HOOK_THREADS" in noted[0]
    assert "PROCMESH_LISTEN" in noted[0]
    log = orchestrator.log()
    assert "PROCMESH_E2E_OPENAI_KEY" not in log  # the config's own: read, not noted


async def test_a_python_sidecar_refuses_a_misspelt_variable_and_serves_beside_anothers() -> None:
    command = [str(BIN / "procmesh-sidecar"), "examples", "--listen", "127.0.0.1:0"]
    err = await asyncio.to_thread(_refused, command, _environ(PROCMESH_HOOK_THREAD="false"))
    assert "unknown environment variable PROCMESH_HOOK_THREAD (did you mean PROCMESH_HOOK_THREADS?)" in err
    out = await asyncio.to_thread(
        _serves, command, _environ(PROCMESH_API_KEYS="key-ada", PROCMESH_HTTP_PORT="4111")
    )
    assert f"PROCMESH_API_KEYS, PROCMESH_HTTP_PORT: {FOREIGN}" in out


async def test_a_program_passing_its_own_settings_to_run_is_checked_too() -> None:
    """`ProcessorSettings` built in code reads the environment as well: `run` checks it."""
    code = (
        "import procmesh\n"
        "from procmesh_sidecars import examples\n"
        "procmesh.run(examples.processors(), procmesh.ProcessorSettings(listen=['127.0.0.1:0']))\n"
    )
    err = await asyncio.to_thread(
        _refused, [str(BIN / "python"), "-c", code], _environ(PROCMESH_GRACE_SECOND="1")
    )
    assert "PROCMESH_GRACE_SECOND (did you mean PROCMESH_GRACE_SECONDS?)" in err


async def test_a_node_sidecar_refuses_a_misspelt_variable_and_serves_beside_anothers() -> None:
    node = require("node")
    require_npm_packages(NODE_SDK)
    command = [node, str(NODE_SDK / "examples" / "serve.mjs"), "--listen", "127.0.0.1:0"]
    err = await asyncio.to_thread(_refused, command, _environ(PROCMESH_METRIC_PORT="9464"))
    assert "unknown environment variable PROCMESH_METRIC_PORT (did you mean PROCMESH_METRICS_PORT?)" in err
    out = await asyncio.to_thread(_serves, command, _environ(PROCMESH_GRPC_SOCKET="/run/o.sock"))
    assert f"PROCMESH_GRPC_SOCKET: {FOREIGN}" in out


async def test_the_cli_refuses_a_misspelt_variable_and_runs_beside_anothers(config_file: Path) -> None:
    command = [str(BIN / "procmesh"), "generate", "a", "hello"]
    err = await asyncio.to_thread(
        _refused, command, _environ(PROCMESH_CONFIG_FILE=str(config_file), PROCMESH_LOG_FORMT="json")
    )
    assert "PROCMESH_LOG_FORMT (did you mean PROCMESH_LOG_FORMAT?)" in err
    proc = await asyncio.to_thread(
        subprocess.run,
        command,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=_environ(PROCMESH_CONFIG_FILE=str(config_file), PROCMESH_LISTEN="127.0.0.1:1"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("You said")
