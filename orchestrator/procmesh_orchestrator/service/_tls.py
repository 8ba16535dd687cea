"""TLS (and client-certificate auth) of the orchestrator's own HTTP and gRPC APIs.

The files are read once at start-up, so a missing or unreadable one is a start-up error naming its
setting, never a server that starts and then fails each handshake. Both APIs take the same pair
and CA: one identity for the pod, one policy for its callers.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from procmesh_orchestrator.errors import ServiceStartError
from procmesh_orchestrator.settings import OrchestratorSettings


@dataclass(frozen=True)
class ServerTls:
    """The certificate, key and optional client CA, as bytes and as the paths they came from."""

    cert_path: str
    key_path: str
    client_ca_path: str | None
    cert: bytes
    key: bytes
    client_ca: bytes | None

    @property
    def mutual(self) -> bool:
        """Callers must present a certificate the client CA signed."""
        return self.client_ca is not None

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """The gRPC port's credentials (client certificates required when `mutual`)."""
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.client_ca, require_client_auth=self.mutual
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The HTTP server's context: TLS 1.2 at least, client certificates required when `mutual`."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_path, self.key_path)
        if self.client_ca_path is not None:
            context.load_verify_locations(cafile=self.client_ca_path)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def server_tls(settings: OrchestratorSettings) -> ServerTls | None:
    """The APIs' TLS from the settings (None: plaintext), each file checked now."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    tls = ServerTls(
        cert_path=settings.tls_cert,
        key_path=settings.tls_key,
        client_ca_path=settings.tls_client_ca,
        cert=_read("tls_cert", settings.tls_cert),
        key=_read("tls_key", settings.tls_key),
        client_ca=_read("tls_client_ca", settings.tls_client_ca) if settings.tls_client_ca else None,
    )
    try:
        tls.ssl_context()  # a key that does not match its certificate fails here, named
    except (ssl.SSLError, OSError) as exc:
        raise ServiceStartError(
            f"PROCMESH_TLS_CERT/PROCMESH_TLS_KEY ({settings.tls_cert}, {settings.tls_key}) "
            f"are not a usable certificate and key: {exc}"
        ) from None
    return tls


def _read(setting: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ServiceStartError(
            f"PROCMESH_{setting.upper()}: cannot read {path}: {exc.strerror or exc}"
        ) from None
    if b"-----BEGIN " not in data:
        raise ServiceStartError(f"PROCMESH_{setting.upper()}: {path} holds no PEM block")
    return data
