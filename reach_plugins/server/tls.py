"""TLS of every server of ours: a certificate and its key, and a client CA for mutual TLS (DESIGN.md 11.4).

``reach gateway``, ``reach node``, ``reach issuer`` and the agent SDK's
``serve()`` all take ``--tls-cert/--tls-key`` (``tls_cert=``/``tls_key=``),
and ``--client-ca`` (``client_ca=``) to require a client certificate signed
by that CA. :class:`ServerTls` checks the files once, at start-up, by loading
them, so a wrong path or a key that does not match its certificate is a
``ConfigError`` naming the flag, never a server that starts and then fails
every handshake. It gives uvicorn its options and the node its PEM bytes for
``grpc.ssl_server_credentials``.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reach_plugins.errors import ConfigError

PathLike = str | os.PathLike[str]


@dataclass(frozen=True, slots=True)
class ServerTls:
    """A server's certificate chain and key (PEM files), and the CA its clients' certificates must chain to."""

    cert: str
    key: str
    client_ca: str | None = None

    def __post_init__(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        for flag, path in (("--tls-cert", self.cert), ("--tls-key", self.key), ("--client-ca", self.client_ca)):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"{flag}: no such file {path!r}")
        try:
            context.load_cert_chain(self.cert, self.key)
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(
                f"--tls-cert/--tls-key: cannot load {self.cert!r} with {self.key!r} (PEM certificate chain and its "
                f"private key, unencrypted): {exc.__class__.__name__}"
            ) from None
        if self.client_ca is not None:
            try:
                context.load_verify_locations(self.client_ca)
            except (ssl.SSLError, ValueError) as exc:
                raise ConfigError(
                    f"--client-ca: {self.client_ca!r} is not a PEM CA certificate: {exc.__class__.__name__}"
                ) from None

    @classmethod
    def given(cls, cert: PathLike | None, key: PathLike | None, client_ca: PathLike | None = None) -> ServerTls | None:
        """The TLS the three flags ask for: ``None`` for none of them; a ``ConfigError`` for half a setting."""
        if cert is None and key is None:
            if client_ca is not None:
                raise ConfigError("--client-ca needs --tls-cert and --tls-key: mutual TLS is TLS with client checks")
            return None
        if cert is None or key is None:
            raise ConfigError("give --tls-cert and --tls-key together (the server's certificate and its key)")
        return cls(os.fspath(cert), os.fspath(key), None if client_ca is None else os.fspath(client_ca))

    @property
    def mutual(self) -> bool:
        """Clients must present a certificate of :attr:`client_ca`."""
        return self.client_ca is not None

    def uvicorn(self) -> dict[str, Any]:
        """uvicorn's options for this TLS (``ssl_cert_reqs=CERT_REQUIRED`` with a client CA)."""
        options: dict[str, Any] = {"ssl_certfile": self.cert, "ssl_keyfile": self.key}
        if self.client_ca is not None:
            options |= {"ssl_ca_certs": self.client_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
        return options

    def pem(self) -> tuple[bytes, bytes, bytes | None]:
        """The key, the certificate chain and the client CA as PEM bytes (for ``grpc.ssl_server_credentials``)."""
        ca = None if self.client_ca is None else Path(self.client_ca).read_bytes()
        return Path(self.key).read_bytes(), Path(self.cert).read_bytes(), ca


def uvicorn_tls(cert: PathLike | None, key: PathLike | None, client_ca: PathLike | None = None) -> dict[str, Any]:
    """uvicorn's options for the three TLS flags (none given: no options, plain HTTP)."""
    tls = ServerTls.given(cert, key, client_ca)
    return {} if tls is None else tls.uvicorn()
