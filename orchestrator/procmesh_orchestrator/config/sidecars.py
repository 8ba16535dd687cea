"""The sidecars of the configuration (``sidecars.NAME``): their addresses, timeouts, failure
policy and TLS."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from procmesh_orchestrator.config.tools import FailurePolicy

BUILTINS = "builtins"
"""The built-in sidecar's name: declare it to use your own; otherwise the orchestrator starts one."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class TLSConfig(_Model):
    """TLS to a sidecar: the CA that signed its certificate, and a client pair for mTLS."""

    ca: str
    """PEM file of the CA that signed the sidecar's certificate."""
    cert: str | None = None
    """PEM client certificate (mTLS)."""
    key: str | None = None
    """PEM client key (mTLS)."""
    server_name: str | None = None
    """Name to verify in the sidecar's certificate (default: the address's host)."""

    @model_validator(mode="after")
    def _pair(self) -> TLSConfig:
        if (self.cert is None) != (self.key is None):
            raise ValueError("tls.cert and tls.key go together (mTLS needs both)")
        return self


_ADDRESS_FORMS = "host:port, unix:///path.sock, dns:///name:port or ipv4:10.0.0.1:50051,10.0.0.2:50051"


def _host_port(entry: str, value: str) -> None:
    host, sep, port = entry.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"{value!r}: {entry!r} is not host:port (address must be {_ADDRESS_FORMS})")


def _check_target(value: str) -> None:
    """Each host:port of a ``dns:`` or ``ipv4:``/``ipv6:`` target (gRPC's naming) has a port."""
    scheme, _, rest = value.partition(":")
    if scheme == "dns":
        # dns:///name:port, dns://resolver:53/name:port (a chosen DNS server), or dns:name:port
        if rest.startswith("//"):
            rest = rest[2:].partition("/")[2]
        _host_port(rest, value)
        return
    entries = rest.split(",")
    for entry in entries:
        _host_port(entry, value)
        if scheme == "ipv6" and not entry.startswith("["):
            raise ValueError(f"{value!r}: write an ipv6 address in brackets, e.g. ipv6:[::1]:50051")


class SidecarConfig(_Model):
    """A sidecar process hosting processors."""

    address: str
    """``host:port``, ``unix:///path.sock``, ``dns:///name:port`` (every address the name resolves
    to, e.g. a headless Service) or ``ipv4:10.0.0.1:50051,10.0.0.2:50051`` (``ipv6:`` likewise):
    calls are balanced round-robin over the replicas."""
    timeout: float = Field(default=5.0, gt=0)
    """Seconds per hook call (the run's remaining deadline caps it); in an output stream, per
    part's answer and for the stream's end after the last part."""
    stream_timeout: float = Field(default=600.0, gt=0)
    """Seconds one output-stream session may stay open (the run's remaining deadline caps it);
    a session still open then is cut and the failure policy applies."""
    on_failure: FailurePolicy = "fail-closed"
    """What a failed call does to the run (processors may override)."""
    tls: TLSConfig | None = None
    """TLS/mTLS to this sidecar (plaintext when absent)."""

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if value.startswith("unix:"):
            if len(value) <= len("unix://"):
                raise ValueError("unix address needs a path, e.g. unix:///run/procmesh/pii.sock")
        elif value.startswith(("dns:", "ipv4:", "ipv6:")):
            _check_target(value)
        elif ":" not in value:
            raise ValueError(f"address must be {_ADDRESS_FORMS}")
        return value
