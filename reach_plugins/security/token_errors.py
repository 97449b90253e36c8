"""Token refusals with their HTTP status: 401 when the token proves nothing, 403 when it proves the wrong thing."""

from __future__ import annotations

from reach_plugins.errors import PermissionDenied, Unauthenticated


class InvalidToken(Unauthenticated):
    """No token, or one that is not a valid, unexpired token of the trusted issuer (HTTP 401)."""


class TokenDenied(PermissionDenied):
    """A valid token that does not entitle this call: another audience, a refused chain or trust level (HTTP 403)."""


def status_of(exc: PermissionDenied) -> int:
    """The HTTP status of a token refusal (403 for any other permission error)."""
    return 401 if isinstance(exc, Unauthenticated) else 403
