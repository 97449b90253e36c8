"""Tiny JSON paths (``data.message.content``, ``$.choices[0].text``) and request templates (``${payload.x}``).

Enough for the ``raw-http`` adapter's request template and response mapping;
no filters or wildcards, so a mapping reads like the body it describes.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

_MISSING = object()
_INDEX = re.compile(r"\[(\d+)\]")
_PLACEHOLDER = re.compile(r"\$\{([^}]+)\}")


def split_path(path: str) -> list[str | int]:
    """``$.a.b[0].c`` -> ``["a", "b", 0, "c"]``; ``$`` or an empty path is the root."""
    text = _INDEX.sub(r".\1", path.strip()).removeprefix("$").strip(".")
    parts: list[str | int] = []
    for part in text.split(".") if text else []:
        parts.append(int(part) if part.isdigit() else part)
    return parts


def lookup(value: Any, path: str, default: Any = _MISSING) -> Any:
    """The value at ``path``; ``KeyError`` naming the path when it is absent and no default is given."""
    current = value
    for part in split_path(path):
        if isinstance(part, int) and isinstance(current, list) and part < len(current):
            current = current[part]
        elif isinstance(current, Mapping) and str(part) in current:
            current = current[str(part)]
        elif default is not _MISSING:
            return default
        else:
            raise KeyError(path)
    return current


def without(value: Any, paths: list[str]) -> Any:
    """A deep copy of ``value`` with the leaves at ``paths`` removed and emptied containers pruned."""
    result = copy.deepcopy(value)
    for path in paths:
        parts = split_path(path)
        if parts:
            _remove(result, parts)
    return result


def _remove(node: Any, parts: list[str | int]) -> bool:
    """Remove ``parts`` under ``node``; True when ``node`` became empty."""
    head, rest = parts[0], parts[1:]
    if isinstance(node, dict) and str(head) in node:
        key: Any = str(head)
    elif isinstance(node, list) and isinstance(head, int) and head < len(node):
        key = head
    else:
        return False
    if not rest or _remove(node[key], rest):
        del node[key]
    return not node


def render(template: Any, context: Mapping[str, Any]) -> Any:
    """Fill ``${path}`` placeholders from ``context``; a string that is one placeholder keeps the value's type."""
    if isinstance(template, Mapping):
        return {key: render(item, context) for key, item in template.items()}
    if isinstance(template, list):
        return [render(item, context) for item in template]
    if not isinstance(template, str):
        return template
    whole = _PLACEHOLDER.fullmatch(template)
    if whole:
        return lookup(context, whole.group(1))
    return _PLACEHOLDER.sub(lambda match: str(lookup(context, match.group(1))), template)
