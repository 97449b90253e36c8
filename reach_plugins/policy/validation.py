"""Check payloads and replies against a capability's JSON Schemas, naming the exact field at fault.

Validators are compiled once per schema and found again by the schema's
identity: capabilities are immutable records whose schemas live as long as
they do, and serialising a schema on every call to look its validator up
cost more than validating a small payload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema import SchemaError
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from reach_plugins.errors import ConfigError, InvalidPayload, InvalidResponse
from reach_plugins.model import Capability

_MAX_VALIDATORS = 1024
_VALIDATORS: dict[int, tuple[dict[str, Any], Validator]] = {}
"""``id(schema) -> (schema, validator)``; the schema is kept so its id cannot be reused while cached."""


def compiled(schema: dict[str, Any], what: str = "schema") -> Validator:
    """The validator of ``schema`` (its ``$schema`` draft, else the latest); ``ConfigError`` if it is invalid."""
    found = _VALIDATORS.get(id(schema))
    if found is not None and found[0] is schema:
        return found[1]
    cls = validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        raise ConfigError(f"{what} is not a valid JSON Schema: {exc.message}") from None
    if len(_VALIDATORS) >= _MAX_VALIDATORS:
        _VALIDATORS.clear()
    validator = cls(schema)
    _VALIDATORS[id(schema)] = (schema, validator)
    return validator


def _problem(schema: dict[str, Any], value: Any, what: str) -> str | None:
    validator = compiled(schema, what)
    if validator.is_valid(value):
        return None
    error = best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    return f"{where or '(top level)'}: {error.message}"


def check_payload(capability: Capability, payload: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidPayload` when ``payload`` does not fit ``params_schema``."""
    if capability.params_schema is None:
        return
    problem = _problem(capability.params_schema, dict(payload), f"params_schema of {capability.name!r}")
    if problem is not None:
        raise InvalidPayload(
            f"payload for {capability.name!r} does not fit its params_schema: {problem}",
            capability=capability.name,
        )


def check_reply(capability: Capability | None, data: Any) -> None:
    """Raise :class:`InvalidResponse` when ``data`` does not fit ``return_schema``."""
    if capability is None or capability.return_schema is None:
        return
    problem = _problem(capability.return_schema, data, f"return_schema of {capability.name!r}")
    if problem is not None:
        raise InvalidResponse(
            f"reply for {capability.name!r} does not fit its return_schema: {problem}",
            capability=capability.name,
        )
