"""How the etcd registry reaches a secured etcd: TLS (server CA, client certificate) and username/password.

Settings come from the registry URL's parameters, else the environment::

    etcd://127.0.0.1:2379/reach?tls=1&ca=/pki/ca.pem&cert=/pki/agent.pem&key=/pki/agent-key.pem
    etcd://127.0.0.1:2379?user=reach-gateway&password_env=ETCD_PASSWORD&ca=/pki/ca.pem

    REACH_ETCD_CA, REACH_ETCD_CERT, REACH_ETCD_KEY, REACH_ETCD_USER, REACH_ETCD_PASSWORD

A password is never a URL parameter (URLs end up in logs): ``password_env``
names the variable holding it (``REACH_ETCD_PASSWORD`` by default). With a
client certificate and no user, etcd takes the user from the certificate's
common name (``--client-cert-auth``): no token to expire, the recommended set-up.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import aetcd
import grpc
from aetcd import rpc, watcher

from reach_plugins.errors import ConfigError

URL_OPTIONS: Final = ("tls", "ca", "cert", "key", "user", "password_env")
_ENV: Final = {"ca": "REACH_ETCD_CA", "cert": "REACH_ETCD_CERT", "key": "REACH_ETCD_KEY", "user": "REACH_ETCD_USER"}
DEFAULT_PASSWORD_ENV: Final = "REACH_ETCD_PASSWORD"


@dataclass(frozen=True, slots=True)
class EtcdAccess:
    """TLS files and credentials for one etcd; the default is plain, unauthenticated gRPC."""

    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    user: str | None = None
    password: str | None = None

    def __repr__(self) -> str:
        return f"EtcdAccess(tls={self.tls}, ca_file={self.ca_file!r}, cert_file={self.cert_file!r}, user={self.user!r})"

    @classmethod
    def from_options(cls, options: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> EtcdAccess:
        """From URL parameters (``options``), each missing one from its environment variable."""

        def pick(name: str) -> str | None:
            return options.get(name) or environ.get(_ENV[name]) or None

        ca, cert, key, user = pick("ca"), pick("cert"), pick("key"), pick("user")
        password_env = options.get("password_env") or DEFAULT_PASSWORD_ENV
        password = environ.get(password_env) or None
        if "password_env" in options and password is None:
            raise ConfigError(f"etcd password_env={password_env}: that environment variable is not set")
        if user is not None and password is None:
            raise ConfigError(f"etcd user {user!r} needs a password: set {password_env} (or password_env=VAR)")
        if (cert is None) != (key is None):
            raise ConfigError("etcd client TLS needs both cert= and key= (REACH_ETCD_CERT and REACH_ETCD_KEY)")
        for path in (ca, cert, key):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"etcd TLS file not found: {path!r}")
        tls = options.get("tls", "").lower() in ("1", "true", "yes") or any((ca, cert))
        return cls(tls, ca, cert, key, user, password if user is not None else None)

    def client(self, host: str, port: int, *, timeout: float, options: Mapping[str, Any] | None = None) -> aetcd.Client:
        """An aetcd client speaking TLS when asked, authenticating with the user when given."""
        if not self.tls:
            return aetcd.Client(
                host, port, username=self.user, password=self.password, timeout=timeout, options=dict(options or {})
            )
        return _TlsClient(self, host, port, timeout=timeout, options=dict(options or {}))

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as handle:
                return handle.read()

        return grpc.ssl_channel_credentials(read(self.ca_file), read(self.key_file), read(self.cert_file))


class _TlsClient(aetcd.Client):  # type: ignore[misc]
    """aetcd's client over a TLS channel (aetcd itself only opens plain channels); the rest is aetcd's."""

    _is_connecting: bool

    def __init__(self, access: EtcdAccess, host: str, port: int, *, timeout: float, options: dict[str, Any]) -> None:
        super().__init__(host, port, username=access.user, password=access.password, timeout=timeout, options=options)
        self._access = access

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            self.channel = rpc.secure_channel(target, self._access.credentials(), options=self._options.items())
            if self._username is not None:
                self.auth_stub = rpc.AuthStub(self.channel)
                request = rpc.AuthenticateRequest(name=self._username, password=self._password)
                try:
                    reply = await self.auth_stub.Authenticate(request, timeout=self._timeout)
                except rpc.AioRpcError as exc:
                    await self.channel.close()
                    aetcd.exceptions._handle_exception(exc)
                self.metadata = (("token", reply.token),)
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = watcher.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata)
            self._connected.set()
        finally:
            self._is_connecting = False
