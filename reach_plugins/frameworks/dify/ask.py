"""The payload of Dify's "Ask an agent" tool, shaped by the capability's own ``params_schema``.

The tool has a question in plain words (``query``) and, optionally, the
arguments as a JSON object (``arguments``). Agents declare what they take: a
LangGraph agent served under a capability name takes ``{"message": ...}``,
``query_order`` takes ``{"order_id": ...}``. Sending ``{"query": ...}`` to
either is refused (``'message' is a required property``), so the question goes
into the one text field the schema asks for; arguments the model gives are sent
as they are. A capability without a schema takes ``{"query": ...}``. When the
question fits no single field and no arguments came, :class:`InvalidPayload`
names the fields to give. Nothing here imports ``dify_plugin``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from reach_plugins.errors import InvalidPayload
from reach_plugins.frameworks.dify.hook import _text
from reach_plugins.model import Capability

QUESTION_PARAMETER: Final = "query"
"""The tool parameter with the question in plain words (also the field sent to a capability without a schema)."""
ARGUMENTS_PARAMETER: Final = "arguments"
"""The tool parameter with the capability's arguments as a JSON object."""


def ask_payload(capability: Capability | None, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """What "Ask an agent" sends to ``capability``: ``arguments``, with the question in the schema's text field.

    ``capability`` ``None`` (not in the registry) gets ``{"query": ...}``: the
    reach then says no agent offers it. Raises :class:`InvalidPayload` when
    there is neither a question nor arguments, or the question fits no single
    field of the schema and no arguments were given.
    """
    name = capability.name if capability is not None else "?"
    question = _text(parameters.get(QUESTION_PARAMETER)) or None
    payload = _arguments(name, parameters.get(ARGUMENTS_PARAMETER))
    field = text_field(capability.params_schema if capability is not None else None)
    if question is None:
        if not payload:
            raise InvalidPayload(
                f"ask_agent for {name!r} got neither a question ({QUESTION_PARAMETER!r}) nor arguments "
                f"({ARGUMENTS_PARAMETER!r}): give one of them"
            )
        return payload
    if field is not None:
        payload.setdefault(field, question)
        return payload
    if payload:
        return payload
    schema = capability.params_schema if capability is not None else None
    raise InvalidPayload(
        f"capability {name!r} takes {_fields(schema)}, which a question in plain words does not fill: give its "
        f"arguments as a JSON object in {ARGUMENTS_PARAMETER!r}, e.g. {json.dumps(_example(schema))}",
        capability=name,
    )


def text_field(schema: Mapping[str, Any] | None) -> str | None:
    """The field a question in plain words fills: ``query`` without a schema, else the schema's one required
    field when it takes a string, else (nothing required) its one string property; ``None`` when there is none."""
    if not schema:
        return QUESTION_PARAMETER
    properties = schema.get("properties") or {}
    required = [str(name) for name in schema.get("required") or []]
    if required:
        return required[0] if len(required) == 1 and _takes_text(properties.get(required[0])) else None
    texts = [str(name) for name, spec in properties.items() if _takes_text(spec)]
    return texts[0] if len(texts) == 1 else None


def _takes_text(spec: Any) -> bool:
    """Whether a property's schema admits a string (an untyped property admits anything)."""
    if not isinstance(spec, Mapping) or "type" not in spec:
        return True
    kind = spec["type"]
    return kind == "string" or (isinstance(kind, list) and "string" in kind)


def _arguments(capability: str, value: Any) -> dict[str, Any]:
    """The ``arguments`` parameter as a dict: empty when blank; a JSON object's text or a mapping as given."""
    if isinstance(value, Mapping):
        return dict(value)
    text = _text(value)
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidPayload(
            f"the arguments for {capability!r} are not JSON ({exc.msg} at character {exc.pos}): give a JSON object "
            'such as {"order_id": "A1001"}',
            capability=capability,
        ) from exc
    if not isinstance(parsed, dict):
        raise InvalidPayload(
            f'the arguments for {capability!r} must be a JSON object such as {{"order_id": "A1001"}}, '
            f"got a {type(parsed).__name__}",
            capability=capability,
        )
    return parsed


def _names(schema: Mapping[str, Any] | None) -> list[str]:
    """The schema's fields worth naming in a message: the required ones, else all of them."""
    schema = schema or {}
    return [str(name) for name in list(schema.get("required") or []) or list(schema.get("properties") or {})]


def _fields(schema: Mapping[str, Any] | None) -> str:
    names = _names(schema)
    return "fields " + ", ".join(repr(name) for name in names) if names else "no field a question fills"


def _example(schema: Mapping[str, Any] | None) -> dict[str, str]:
    return dict.fromkeys(_names(schema), "...")
