"""What JSON cannot carry in a payload (NaN, Infinity, nesting past the interpreter's limit), found before sending.

orjson writes NaN and Infinity as ``null`` and the stdlib as bare ``NaN``
(not JSON at all): either way the agent would not get what the caller meant,
so a payload holding one is refused with the place it sits.
"""

from __future__ import annotations

from collections.abc import Iterable
from math import isfinite
from typing import Any


def json_problem(payload: dict[str, Any]) -> str | None:
    """What stops ``payload`` from travelling as JSON, in words naming the place and the fix; ``None`` if nothing."""
    try:
        finite = _finite(payload.values())
    except RecursionError:
        return "payload is nested too deeply to send as JSON; flatten it"
    if finite:
        return None
    return f"{_not_finite_path(payload)} is NaN or Infinity, which JSON cannot carry; send null or a string"


def _finite(values: Iterable[Any]) -> bool:
    """Whether no float inside ``values`` (through dicts and lists) is NaN or Infinity; strings are not looked into."""
    for item in values:
        if type(item) is str:
            continue
        if isinstance(item, float):
            if not isfinite(item):
                return False
        elif isinstance(item, dict):
            if not _finite(item.values()):
                return False
        elif isinstance(item, list | tuple) and not _finite(item):
            return False
    return True


def _not_finite_path(value: Any, path: str = "payload") -> str:
    """Where the first NaN/Infinity inside ``value`` is, for the error message (the slow path: it was found)."""
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    for key, child in children:
        inner = f"{path}.{key}" if isinstance(value, dict) else f"{path}[{key}]"
        if isinstance(child, float) and not isfinite(child):
            return inner
        if isinstance(child, dict | list | tuple) and not _finite([child]):
            return _not_finite_path(child, inner)
    return path
