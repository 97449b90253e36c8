"""Translate the seeds' YAML shapes into the canonical AgentDescriptor layout, before validation.

The articles this library grew from write agents in several dialects. Each is
accepted and rewritten, explicitly, into the field names of
:class:`reach_plugins.model.AgentDescriptor`:

=====================================  ===============================================
written                                becomes
=====================================  ===============================================
``agents: [...]``                      the agents, in order (the canonical shape)
``agent: {...}``                       one more agent (a registration template)
``connectors: {name: {...}}``          one agent per entry, named by its key
``endpoint: URL`` / ``base_url: URL``  ``endpoints: [URL]``
``timeout: {...}``                     ``timeouts: {...}`` (agents and capabilities)
``tools: [...]`` inside an agent       ``capabilities: [...]``
``weight`` / ``priority`` / ``cost``   ``routing: {weight, priority, cost}``
``health_check.interval_sec``          ``health_check.interval``
``protocol: http``                     ``protocol: raw-http``
``version: 2.1`` (a number)            ``version: "2.1"``
=====================================  ===============================================

A top-level ``tools:`` list is a catalogue of capability declarations (the
seeds' "every tool method declares its idempotency key"): an agent capability
with the same name inherits every field it does not set itself; a catalogue
entry that no agent offers is kept in ``ReachConfig.tools``.

Problems are collected as ``(path, message)`` pairs so that one run reports
every mistake, each at the path the user wrote (not the translated one);
pydantic's errors are rewritten into the same form.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from reach_plugins.errors import ConfigError

Loc = tuple[str | int, ...]
Problems = list[tuple[str, str]]

TOP_LEVEL_KEYS = (
    "agents",
    "agent",
    "connectors",
    "tools",
    "defaults",
    "tenants",
    "secrets",
    "quotas",
    "matching",
    "loops",
    "relief",
)
_PROTOCOL_ALIASES = {"http": "raw-http"}
_ROUTING_KEYS = ("weight", "priority", "cost")
_ENDPOINT_KEYS = ("endpoint", "endpoints", "base_url")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_KEY = re.compile(r"^value$|_value$|token|passw|pwd|secret|api_?key|private|credential", re.IGNORECASE)
_PEM = "-----BEGIN"


@dataclass(slots=True)
class Shaped:
    """One record in canonical form, with where it was written and how its keys were renamed."""

    path: str
    body: dict[str, Any]
    renames: dict[Loc, Loc] = field(default_factory=dict)

    def user_loc(self, loc: Loc) -> Loc:
        """Map a location in ``body`` back to the keys the user wrote (``timeouts`` -> ``timeout``)."""
        for canonical, written in sorted(self.renames.items(), key=lambda item: -len(item[0])):
            if loc[: len(canonical)] == canonical:
                loc = written + loc[len(canonical) :]
        return loc


def format_loc(loc: Loc) -> str:
    """``("agents", 2, "name")`` -> ``agents[2].name``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def join_path(prefix: str, loc: Loc) -> str:
    rest = format_loc(loc)
    if not rest:
        return prefix
    return f"{prefix}{rest}" if rest.startswith("[") else f"{prefix}.{rest}"


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``base`` overridden key by key by ``over``; nested mappings merge, anything else is replaced."""
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        if isinstance(below, Mapping) and isinstance(value, Mapping):
            merged[key] = deep_merge(below, value)
        else:
            merged[key] = value
    return merged


def merge_defaults(defaults: Mapping[str, Any], agent: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge an agent over ``defaults:``; an ``auth`` of another ``type`` replaces the default one whole.

    Merging a default header key into a certificate auth would send a credential
    the agent never asked for, so auth blocks merge only when their types agree.
    """
    merged = deep_merge(defaults, agent)
    own, default = agent.get("auth"), defaults.get("auth")
    if isinstance(own, Mapping) and isinstance(default, Mapping):
        kinds = {own.get("type"), default.get("type")}
        if len(kinds) == 2 and None not in kinds:
            merged["auth"] = dict(own)
    return merged


def collect_agents(doc: Mapping[str, Any], problems: Problems) -> list[Shaped]:
    """Every agent of the document (``agents:``, ``agent:``, ``connectors:``) in canonical form."""
    found: list[Shaped | None] = []
    listed = doc.get("agents", [])
    if not isinstance(listed, list):
        problems.append(("agents", f"expected a list of agents, got {type(listed).__name__}"))
        listed = []
    for index, raw in enumerate(listed):
        found.append(_shape_entry(raw, f"agents[{index}]", None, problems))
    if "agent" in doc:
        found.append(_shape_entry(doc["agent"], "agent", None, problems))
    connectors = doc.get("connectors", {})
    if not isinstance(connectors, Mapping):
        problems.append(("connectors", "expected a mapping of connector name to its settings"))
        connectors = {}
    for name, raw in connectors.items():
        found.append(_shape_entry(raw, f"connectors.{name}", str(name), problems))
    return [agent for agent in found if agent is not None]


def _shape_entry(raw: Any, path: str, name: str | None, problems: Problems) -> Shaped | None:
    if not isinstance(raw, Mapping):
        problems.append((path, f"expected a mapping of agent fields, got {type(raw).__name__}"))
        return None
    shaped = Shaped(path=path, body={})
    body = shape_blocks(raw, path, problems, shaped.renames)
    if name is not None:
        if "name" in body and body["name"] != name:
            problems.append((f"{path}.name", f"name {body['name']!r} differs from the connector key {name!r}"))
        body.setdefault("name", name)
    _shape_endpoints(body, path, problems, shaped.renames)
    _rename(body, "tools", "capabilities", path, problems, shaped.renames)
    if isinstance(body.get("version"), int | float) and not isinstance(body["version"], bool):
        body["version"] = str(body["version"])
    if isinstance(body.get("capabilities"), list):
        capabilities = []
        for index, item in enumerate(body["capabilities"]):
            capability = shape_capability(item, f"{path}.capabilities[{index}]", problems)
            capabilities.append(capability.body)
            prefix: Loc = ("capabilities", index)
            shaped.renames.update({prefix + loc: prefix + written for loc, written in capability.renames.items()})
        body["capabilities"] = capabilities
    shaped.body = body
    return shaped


def shape_blocks(raw: Mapping[str, Any], path: str, problems: Problems, renames: dict[Loc, Loc]) -> dict[str, Any]:
    """Rewrite the agent-level blocks shared by agents and ``defaults:`` (timeout, routing keys, protocol...)."""
    body = dict(raw)
    _rename(body, "timeout", "timeouts", path, problems, renames)
    moved = {key: body.pop(key) for key in _ROUTING_KEYS if key in body}
    if moved:
        routing = body.get("routing", {})
        if not isinstance(routing, Mapping):
            problems.append((f"{path}.routing", "expected a mapping such as {weight: 80, priority: 1}"))
            routing = {}
        for key in sorted(set(moved) & set(routing)):
            problems.append((f"{path}.{key}", f"give '{key}' either on the agent or in 'routing', not both"))
        body["routing"] = {**routing, **moved}
        renames.update({("routing", key): (key,) for key in moved})
    health = body.get("health_check")
    if isinstance(health, Mapping) and "interval_sec" in health:
        health = dict(health)
        _rename(health, "interval_sec", "interval", f"{path}.health_check", problems, {})
        body["health_check"] = health
        renames[("health_check", "interval")] = ("health_check", "interval_sec")
    if isinstance(body.get("protocol"), str):
        body["protocol"] = _PROTOCOL_ALIASES.get(body["protocol"], body["protocol"])
    return body


def _shape_endpoints(body: dict[str, Any], path: str, problems: Problems, renames: dict[Loc, Loc]) -> None:
    given = [key for key in _ENDPOINT_KEYS if key in body]
    if len(given) > 1:
        problems.append((path, f"give only one of {', '.join(given)}"))
        return
    if not given or given[0] == "endpoints":
        return
    key = given[0]
    value = body.pop(key)
    if isinstance(value, list):
        body["endpoints"] = value
        renames[("endpoints",)] = (key,)
    else:
        body["endpoints"] = [value]
        renames[("endpoints", 0)] = (key,)


def shape_capability(item: Any, path: str, problems: Problems) -> Shaped:
    """A capability (or a catalogue tool) with ``timeout`` renamed; plain names pass through."""
    shaped = Shaped(path=path, body=item)
    if isinstance(item, Mapping):
        shaped.body = dict(item)
        _rename(shaped.body, "timeout", "timeouts", path, problems, shaped.renames)
    return shaped


def apply_catalogue(body: Mapping[str, Any], catalogue: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Give each capability of an agent the fields of the same-named ``tools:`` entry it does not set."""
    capabilities = body.get("capabilities")
    if not catalogue or not isinstance(capabilities, list):
        return dict(body)
    merged = []
    for item in capabilities:
        own = {"name": item} if isinstance(item, str) else item
        name = own.get("name") if isinstance(own, Mapping) else None
        merged.append(deep_merge(catalogue[name], own) if isinstance(name, str) and name in catalogue else item)
    return {**body, "capabilities": merged}


def _rename(body: dict[str, Any], old: str, new: str, path: str, problems: Problems, renames: dict[Loc, Loc]) -> None:
    if old not in body:
        return
    if new in body:
        problems.append((path, f"give either '{old}' or '{new}', not both"))
        return
    body[new] = body.pop(old)
    renames[(new,)] = (old,)


def check_env_name(value: str, what: str) -> str:
    """An ``*_env`` field names a variable; a value that cannot be a name is probably the secret itself."""
    if not _ENV_NAME.match(value):
        raise ValueError(
            f"{what} must name an environment variable (such as CLOUD_SALES_TOKEN), not hold the secret; "
            "put the secret in that variable"
        )
    return value


def check_secret_refs(block: Any, path: str, known: frozenset[str], problems: Problems) -> bool:
    """Refuse literal secrets in an ``auth`` block or a tenant credential; ``True`` when it holds none."""
    before = len(problems)
    for key, value in block.items() if isinstance(block, Mapping) else ():
        where = f"{path}.{key}"
        if key not in known and _SECRET_KEY.search(str(key)):
            problems.append((where, "literal secrets are not allowed in config; use value_env (an env variable)"))
        elif str(key).endswith("_env") and isinstance(value, str):
            try:
                check_env_name(value, str(key))
            except ValueError as exc:
                problems.append((where, str(exc)))
        elif isinstance(value, str) and _PEM in value:
            problems.append((where, f"{key} holds a PEM block; give a file path or use {key}_env"))
    return len(problems) == before


_SECRET_OPTION = re.compile(
    r"(^|_)(token|access_token|api_?key|apikey|password|passwd|secret|client_secret|authorization|bearer|"
    r"private_key|credentials?)$",
    re.IGNORECASE,
)
"""Keys of ``protocol_options`` (at any depth) that would hold a secret (``max_tokens`` is not one)."""
_SECRET_VALUE = re.compile(r"^(bearer|basic)\s+\S|-----BEGIN|^[a-z][a-z0-9+.-]*://[^/@\s]*:[^/@\s]*@", re.IGNORECASE)
"""Values that are secrets whatever their key: an auth header value, a PEM block, a URL with a password."""


def check_literal_secrets(block: Any, path: str, problems: Problems) -> None:
    """Refuse literal secrets anywhere inside ``block`` (``protocol_options``): secrets come from ``*_env`` only."""
    stack: list[tuple[Any, str]] = [(block, path)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, Mapping):
            for key, child in value.items():
                inner = f"{where}.{key}"
                if isinstance(child, str) and child and _SECRET_OPTION.search(str(key)):
                    problems.append((inner, "literal secrets are not allowed in config; give the agent an auth block"))
                else:
                    stack.append((child, inner))
        elif isinstance(value, list):
            stack.extend((child, f"{where}[{index}]") for index, child in enumerate(value))
        elif isinstance(value, str) and _SECRET_VALUE.search(value):
            problems.append((where, "this looks like a credential; literal secrets are not allowed, use an auth block"))


def closest(name: str, known: list[str]) -> str:
    """A hint for a misspelt name: the closest known ones, else all of them."""
    close = difflib.get_close_matches(name, known, n=3)
    if close:
        return f"; did you mean {', '.join(map(repr, close))}?"
    return f"; known: {', '.join(known)}" if known else ""


# --------------------------------------------------------------------------- reading and reporting


MAX_EXPANDED: Final = 100_000
"""Most YAML values a document may stand for once its aliases are expanded (a billion laughs stands for 10^9)."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML would silently keep the last).

    It also counts, before anything is constructed, how many values the
    document stands for with every alias expanded: a small file whose aliases
    nest (billion laughs) is refused instead of expanding when serialised.
    """

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node


def _check_expansion(root: yaml.Node) -> None:
    """``ConstructorError`` when ``root`` expands to more than :data:`MAX_EXPANDED` values, or refers to itself."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        if children_done:
            open_.discard(key)
            sizes[key] = total = 1 + sum(sizes[id(child)] for child in children)
            if total > MAX_EXPANDED:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"its aliases expand to more than {MAX_EXPANDED} values; write the values out",
                    node.start_mark,
                )
            continue
        if key in open_:
            raise yaml.constructor.ConstructorError(None, None, "an alias refers to itself", node.start_mark)
        open_.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)


def _unique_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Hashable, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, Hashable) and key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is given twice (first on line {seen[key] + 1})", key_node.start_mark
            )
        if isinstance(key, Hashable):
            seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_yaml(text: str, source: str) -> Any:
    """Parse YAML text; a syntax error is a ``ConfigError`` with the line and column."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        context = f" ({exc.context})" if exc.context else ""
        raise ConfigError(f"{source}: {where}: invalid YAML: {exc.problem}{context}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"{source}: invalid YAML: nested too deeply") from None


def validation_problems(exc: ValidationError, model: type[BaseModel], shaped: Shaped) -> Problems:
    """Rewrite pydantic's errors as ``(path the user wrote, message telling what to fix)``."""
    problems: Problems = []
    for error in exc.errors(include_url=False):
        loc: Loc = tuple(error["loc"])
        problems.append((join_path(shaped.path, shaped.user_loc(loc)), _describe(error, model, loc)))
    return problems


def _describe(error: Mapping[str, Any], model: type[BaseModel], loc: Loc) -> str:
    kind, message, value = error["type"], str(error["msg"]), error.get("input")
    if kind == "extra_forbidden":
        known = known_keys(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
        return f"unknown key {loc[-1]!r}; {hint}"
    if kind == "missing":
        return f"missing required key {loc[-1]!r}"
    if message.startswith("Value error, "):
        return message.removeprefix("Value error, ")
    if isinstance(value, Mapping | list) or value is None:
        return message
    return f"{message}, got {value!r}"


def known_keys(model: type[BaseModel], loc: Loc) -> list[str]:
    """The field names accepted at ``loc`` below ``model`` (empty when ``loc`` is not a record)."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        origin = get_origin(current)
        if isinstance(part, int) and origin is list:
            current = get_args(current)[0]
        elif isinstance(current, type) and issubclass(current, BaseModel) and part in current.model_fields:
            current = current.model_fields[str(part)].annotation
        elif origin is dict:
            current = get_args(current)[1]
        else:
            return []
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return []


def _unwrap(annotation: Any) -> Any:
    """Strip ``Annotated`` and ``X | None`` down to ``X``."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _unwrap(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        members = [arg for arg in get_args(annotation) if arg is not type(None)]
        return _unwrap(members[0]) if len(members) == 1 else annotation
    return annotation
