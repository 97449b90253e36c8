"""Credentials on the wire: a header, a query parameter, a bearer token, or an mTLS client certificate."""

from __future__ import annotations

import dataclasses
import functools
import os
import ssl

from reach_plugins.errors import ConfigError
from reach_plugins.protocols import HttpRequest
from reach_plugins.transport import Credential


def with_credential(request: HttpRequest, credential: Credential) -> HttpRequest:
    """``request`` carrying ``credential`` (certificates travel in the TLS context, see :func:`tls_context`)."""
    kind = credential.type
    if kind in ("none", "cert"):
        return request
    if not credential.value:
        raise ConfigError(
            f"the {kind!r} credential has no value: set the environment variable named by the agent's auth.value_env"
        )
    if kind == "bearer":
        return dataclasses.replace(request, headers={**request.headers, "Authorization": f"Bearer {credential.value}"})
    if not credential.key:
        raise ConfigError(f"the {kind!r} credential needs 'key', the name of the header or query parameter")
    if kind == "header":
        return dataclasses.replace(request, headers={**request.headers, credential.key: credential.value})
    return dataclasses.replace(request, params={**request.params, credential.key: credential.value})


def tls_identity(credential: Credential) -> tuple[str, str | None, str | None] | None:
    """The files of a ``cert`` credential (the key of its connection pool), else ``None``."""
    if credential.type != "cert":
        return None
    if not credential.cert_file:
        raise ConfigError("the 'cert' credential needs cert_file (auth.client_cert or auth.client_cert_env)")
    return (credential.cert_file, credential.key_file, credential.ca_file)


@functools.lru_cache(maxsize=64)
def tls_context(cert_file: str, key_file: str | None, ca_file: str | None) -> ssl.SSLContext:
    """A client TLS context presenting ``cert_file``/``key_file``, trusting ``ca_file`` (or the system CAs)."""
    for path in (cert_file, key_file, ca_file):
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"TLS file not found: {path!r} (check the agent's auth.client_cert, client_key, ca_file)")
    try:
        context = ssl.create_default_context(cafile=ca_file)
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        raise ConfigError(f"cannot load the client certificate {cert_file!r}: {exc.reason or exc}") from exc
    return context
