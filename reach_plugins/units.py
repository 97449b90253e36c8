"""Human units in configuration: durations (``90s``, ``1000ms``) and ratios (``50%``); tokens from characters.

Config files are written by people; they write ``90s`` and ``30%``. The model
stores plain floats (seconds, fractions) so the code never parses units twice.
Tokens are estimated from characters in one place (:func:`estimate_tokens`):
usage figures and the router's ``input_tokens_required`` check agree.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator

CHARS_PER_TOKEN = 4.0
"""The usual estimate for English-like text, used where no tokenizer's count is at hand."""


def estimate_tokens(chars: int) -> int:
    """Tokens in ``chars`` characters of text, estimated."""
    return math.ceil(chars / CHARS_PER_TOKEN) if chars > 0 else 0


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_SCALE = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """Return seconds for ``90s``, ``1000ms``, ``2m``, ``1h`` or a bare number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as '90s' or '1000ms', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _SCALE[match.group(2)]
    else:
        raise ValueError(f"expected a duration such as '90s' or '1000ms', got {value!r}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative, got {value!r}")
    return seconds


def parse_ratio(value: Any) -> float:
    """Return a fraction in [0, 1] for ``30%``, ``0.3`` or ``30`` (read as percent when > 1)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a ratio such as '30%' or 0.3, got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        try:
            ratio = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise ValueError(f"expected a ratio such as '30%' or 0.3, got {value!r}") from None
    elif isinstance(value, int | float):
        ratio = float(value)
    else:
        raise ValueError(f"expected a ratio such as '30%' or 0.3, got {value!r}")
    if ratio > 1:
        ratio /= 100
    if not 0 <= ratio <= 1:
        raise ValueError(f"a ratio must lie between 0% and 100%, got {value!r}")
    return ratio


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""Seconds, written in config as ``90s``, ``1000ms``, ``2m`` or a number of seconds."""

Ratio = Annotated[float, BeforeValidator(parse_ratio)]
"""A fraction in [0, 1], written in config as ``30%`` or ``0.3``."""
