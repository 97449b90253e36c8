"""Check payloads and replies against a capability's JSON Schemas, naming the exact field at fault."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from reach_plugins.errors import InvalidPayload, InvalidResponse
from reach_plugins.model import Capability


@lru_cache(maxsize=1024)
def _validator(schema_json: str) -> Draft202012Validator:
    schema = json.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _problem(schema: Mapping[str, Any], value: Any) -> str | None:
    validator = _validator(json.dumps(schema, sort_keys=True))
    error = best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    return f"{where or '(top level)'}: {error.message}"


def check_payload(capability: Capability, payload: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidPayload` when ``payload`` does not fit ``params_schema``."""
    if capability.params_schema is None:
        return
    problem = _problem(capability.params_schema, dict(payload))
    if problem is not None:
        raise InvalidPayload(
            f"payload for {capability.name!r} does not fit its params_schema: {problem}",
            capability=capability.name,
        )


def check_reply(capability: Capability | None, data: Any) -> None:
    """Raise :class:`InvalidResponse` when ``data`` does not fit ``return_schema``."""
    if capability is None or capability.return_schema is None:
        return
    problem = _problem(capability.return_schema, data)
    if problem is not None:
        raise InvalidResponse(
            f"reply for {capability.name!r} does not fit its return_schema: {problem}",
            capability=capability.name,
        )
