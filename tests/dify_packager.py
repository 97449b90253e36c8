"""``scripts/dify_package.py`` loaded as a module, for the tests that build and check Dify plugin packages."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load() -> ModuleType:
    """The packager script as a module (registered in ``sys.modules``: its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location("dify_package", ROOT / "scripts" / "dify_package.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


packager = load()
