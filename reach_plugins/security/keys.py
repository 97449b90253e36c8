"""Signing keys of a token issuer: Ed25519 (JWS ``EdDSA``), loaded from PEM files or the environment, published as JWKS.

A :class:`KeyRing` signs with its newest key and publishes every key it
holds: rotation adds a new key in front and keeps the previous one published
until the tokens it signed have expired (at most :data:`MAX_TTL`), so
verifiers that refetch the JWKS on an unknown ``kid`` never see a gap.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jwt.algorithms import OKPAlgorithm

from reach_plugins.errors import ConfigError

ALGORITHM: Final = "EdDSA"
ENV_KEYS: Final = "REACH_ISSUER_KEYS"
"""Environment variable holding PEM private keys (newest first, concatenated) when no key file is given."""


def _kid(key: Ed25519PrivateKey) -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.urlsafe_b64encode(hashlib.sha256(raw).digest()[:12]).decode().rstrip("=")


@dataclass(frozen=True, slots=True)
class SigningKey:
    """One Ed25519 private key and its key id (derived from the public key, so every process agrees)."""

    kid: str
    private: Ed25519PrivateKey
    header: str = field(init=False, repr=False, compare=False)
    """The JWS protected header every token this key signs carries, encoded once."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "header", _segment({"alg": ALGORITHM, "kid": self.kid, "typ": "JWT"}))

    @classmethod
    def generate(cls) -> SigningKey:
        key = Ed25519PrivateKey.generate()
        return cls(_kid(key), key)

    @classmethod
    def from_pem(cls, pem: bytes, *, source: str = "<pem>") -> SigningKey:
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{source}: not an unencrypted PEM private key ({exc})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{source}: the issuer signs with Ed25519 keys (openssl genpkey -algorithm ed25519)")
        return cls(_kid(key), key)

    def sign(self, claims: Mapping[str, Any]) -> str:
        """``claims`` as a compact JWS (``EdDSA``, this key's ``kid``), what ``jwt.encode`` makes, without its
        per-call key preparation and option handling: a caller spreading calls over many agents signs once per
        agent, so a miss costs one signature and little else."""
        signing_input = f"{self.header}.{_segment(claims)}".encode()
        signature = base64.urlsafe_b64encode(self.private.sign(signing_input)).rstrip(b"=").decode()
        return f"{signing_input.decode()}.{signature}"

    def pem(self) -> bytes:
        """The private key as PKCS#8 PEM (what ``reach issuer --new-key`` writes)."""
        return self.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def public_jwk(self) -> dict[str, Any]:
        jwk: dict[str, Any] = OKPAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        return {**jwk, "kid": self.kid, "alg": ALGORITHM, "use": "sig"}


def _segment(value: Mapping[str, Any]) -> str:
    """One base64url segment of a JWS: compact JSON, no padding (RFC 7515)."""
    raw = json.dumps(value, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _split_pems(text: str) -> list[bytes]:
    marker = "-----END PRIVATE KEY-----"
    return [(part + marker).strip().encode() for part in text.split(marker) if part.strip()]


class KeyRing:
    """The issuer's keys: ``active`` signs, all are published (newest first)."""

    def __init__(self, keys: Sequence[SigningKey]) -> None:
        if not keys:
            raise ConfigError("a token issuer needs at least one signing key")
        self._keys = list(keys)

    @classmethod
    def load(cls, files: Sequence[str | os.PathLike[str]] = (), *, environ: Mapping[str, str] = os.environ) -> KeyRing:
        """Keys from PEM ``files`` (newest first), else from ``$REACH_ISSUER_KEYS``, else one fresh key."""
        if files:
            keys = []
            for path in files:
                try:
                    data = open(path, "rb").read()  # noqa: SIM115 - tiny file, read once at start
                except OSError as exc:
                    raise ConfigError(f"cannot read the issuer key file {os.fspath(path)!r}: {exc.strerror}") from None
                keys.append(SigningKey.from_pem(data, source=os.fspath(path)))
            return cls(keys)
        text = environ.get(ENV_KEYS, "")
        if text.strip():
            return cls([SigningKey.from_pem(pem, source=f"${ENV_KEYS}") for pem in _split_pems(text)])
        return cls([SigningKey.generate()])

    @property
    def active(self) -> SigningKey:
        return self._keys[0]

    def get(self, kid: str) -> SigningKey | None:
        return next((key for key in self._keys if key.kid == kid), None)

    def rotate(self, new: SigningKey | None = None, *, keep: int = 1) -> SigningKey:
        """Sign with ``new`` (a fresh key by default) from now on; keep ``keep`` previous keys published."""
        key = new or SigningKey.generate()
        self._keys = [key, *self._keys[: max(0, keep)]]
        return key

    def retire(self, kid: str) -> None:
        """Stop publishing ``kid`` (once the tokens it signed have expired); the active key cannot be retired."""
        if kid == self.active.kid:
            raise ConfigError(f"key {kid!r} is the active signing key; rotate before retiring it")
        self._keys = [key for key in self._keys if key.kid != kid]

    def jwks(self) -> dict[str, Any]:
        return {"keys": [key.public_jwk() for key in self._keys]}
