"""Every procmesh component's ``PROCMESH_*`` environment variables, in one list.

A misspelt variable (``PROCMESH_API_KEYS`` without its ``S``) must not start a process on its
defaults, yet a Kubernetes ConfigMap shared through ``envFrom`` puts the orchestrator's
variables into a sidecar's environment and the other way round. So each process checks its
environment against this list at start-up (`check_environment`):

- a variable of its own component: read;
- a variable another component reads (`COMPONENTS`): started anyway, not read here, named in one
  INFO log line at start (`EnvironmentCheck.foreign`);
- any other ``PROCMESH_`` variable: a start-up error (exit status 2) naming it and the closest
  known name.

The orchestrator also takes the variables its configuration names (a provider's ``apiKeyEnv``, the
store's ``dsnEnv``, a Redis ``urlEnv``): no other component can know those, so give them a name
without the ``PROCMESH_`` prefix, or keep them out of the sidecars' environment (they are secrets a
sidecar should not hold anyway). The Node SDK (``sdk/node/lib/environment.json``) and the Go
example sidecar (``examples/go/environment.json``) each hold a copy of this list; a unit test
keeps every copy equal to it.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from dataclasses import dataclass

__all__ = [
    "COMPONENTS",
    "PREFIX",
    "PREFIXES",
    "RENAMED",
    "EnvironmentCheck",
    "check_environment",
]

PREFIX = "PROCMESH_"
"""The prefix every procmesh variable carries; only variables with it are checked."""

_SERVING = ("LOG_LEVEL", "LOG_FORMAT", "TLS_CERT", "TLS_KEY", "TLS_CLIENT_CA")
_GATEWAY = (
    "MODEL_GATEWAY",
    "MODEL_GATEWAY_KEY",
    "MODEL_GATEWAY_CA",
    "MODEL_GATEWAY_CERT",
    "MODEL_GATEWAY_CERT_KEY",
)
_SIDECAR = ("LISTEN", "METRICS_PORT", "METRICS_HOST", "GRACE_SECONDS", "PARENT_PID", *_SERVING, *_GATEWAY)


def _names(*suffixes: str) -> frozenset[str]:
    return frozenset(PREFIX + suffix for suffix in suffixes)


COMPONENTS: Mapping[str, frozenset[str]] = {
    "orchestrator": _names(
        *_SERVING,
        "CONFIG_FILE",
        "HTTP_HOST",
        "HTTP_PORT",
        "GRPC_HOST",
        "GRPC_PORT",
        "GRPC_SOCKET",
        "API_KEYS",
        "MAX_REQUEST_BYTES",
        "DRAIN_GRACE_SECONDS",
        "ABORT_ON_DISCONNECT",
        "TRUSTED_CONTEXT",
        "UNTRUSTED_CONTEXT",
        "TRUST_REQUEST_CONTEXT",
        "HEALTH_POLL_SECONDS",
        "CONFIG_POLL_SECONDS",
        "ALLOW_UNAUTHENTICATED",
        "ALLOWED_HOSTS",
        "MAX_CONNECTIONS",
        "HEADER_TIMEOUT_SECONDS",
        "BODY_TIMEOUT_SECONDS",
        "MAX_INPUT_MESSAGES",
        "MAX_INPUT_DEPTH",
        "MAX_INPUT_STRING_CHARS",
        "SSE_HEARTBEAT_SECONDS",
        "SLOW_CLIENT_SECONDS",
        "MAX_INFLIGHT_PER_KEY",
    ),
    "cli": _names("CONFIG_FILE", "LOG_FORMAT", "NODE_SDK", "NODE"),
    "python-sidecar": _names(*_SIDECAR, "HOOK_THREADS"),
    "node-sidecar": _names(*_SIDECAR, "PROTO_DIR"),
    "development": _names("SHARED", "BENCH_QUICK", "LLM_BASE_URL"),
}
"""Each component's variables: ``orchestrator`` (procmesh-orchestrator), ``cli`` (the procmesh
command), ``python-sidecar`` (`procmesh.run`, procmesh-sidecar), ``node-sidecar`` (the Node SDK's
``run``) and ``development`` (this repository's tests and benchmarks, whose processes inherit
them)."""

PREFIXES: Mapping[str, tuple[str, ...]] = {
    "orchestrator": ("PROCMESH_CONFIG__",),
    "cli": ("PROCMESH_CONFIG__",),
    "development": ("PROCMESH_TEST_",),
}
"""Families of variables a component reads by prefix: ``PROCMESH_CONFIG__<KEY>__...`` overrides a
key of the configuration file (an unknown key is the configuration's error), and the tests'
``PROCMESH_TEST_*`` (their own databases and keys)."""

RENAMED: Mapping[str, str] = {"PROCMESH_CONFIG": "PROCMESH_CONFIG_FILE"}
"""Old names, refused with their new one."""


def _known_to(component: str, name: str) -> bool:
    return name in COMPONENTS[component] or name.startswith(PREFIXES.get(component, ()))


@dataclass(frozen=True)
class EnvironmentCheck:
    """What a process's ``PROCMESH_*`` variables are to its component."""

    component: str
    unknown: tuple[str, ...]
    """Variables no component reads (misspelt, renamed or retired): a start-up error."""
    foreign: tuple[str, ...]
    """Variables another component reads (a shared ConfigMap): not read here, logged at start."""

    def error(self) -> str | None:
        """One line naming every unknown variable and what was probably meant; None when none."""
        if not self.unknown:
            return None
        known = sorted(set().union(*COMPONENTS.values()))
        mine = sorted(COMPONENTS[self.component])
        described = []
        for name in self.unknown:
            if name in RENAMED:
                described.append(f"{name} (renamed {RENAMED[name]})")
                continue
            close = difflib.get_close_matches(name, mine, n=1) or difflib.get_close_matches(name, known, n=1)
            described.append(f"{name} (did you mean {close[0]}?)" if close else name)
        return (
            f"unknown environment variable{'s' if len(described) > 1 else ''} {', '.join(described)}: "
            f"no procmesh component reads {'them' if len(described) > 1 else 'it'} (unset it, or "
            "fix its name; the variables are listed in docs/running.md)"
        )

    def note(self) -> str | None:
        """The INFO line naming another component's variables (not read here); None when none."""
        if not self.foreign:
            return None
        return (
            f"{', '.join(self.foreign)}: other procmesh components' settings (a shared ConfigMap?), "
            f"not read by the {self.component}"
        )


def check_environment(
    component: str, environ: Mapping[str, str], *, also: Collection[str] = ()
) -> EnvironmentCheck:
    """Sort `environ`'s ``PROCMESH_*`` variables for `component` (a key of `COMPONENTS`).

    Args:
        component: Whose process this is.
        environ: The environment (``os.environ``).
        also: Further variables this process reads (the orchestrator: those its config names).
    """
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r} (one of {', '.join(sorted(COMPONENTS))})")
    unknown, foreign = [], []
    for name in sorted(environ):
        if not name.startswith(PREFIX) or _known_to(component, name) or name in also:
            continue
        if name not in RENAMED and any(_known_to(other, name) for other in COMPONENTS):
            foreign.append(name)
        else:
            unknown.append(name)
    return EnvironmentCheck(component, tuple(unknown), tuple(foreign))
