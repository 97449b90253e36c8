"""The public surface: flat re-exports, sorted __all__, and an import that pulls in no framework."""

from __future__ import annotations

import json
import subprocess
import sys

import reach_plugins

HEAVY = (
    "langchain",
    "langgraph",
    "llama_index",
    "dify_plugin",
    "grpc",
    "aetcd",
    "redis",
    "numpy",
    "tokenizers",
    "aiohttp",
    "httpx",
    "uvicorn",
    "starlette",
)


def test_all_is_sorted_and_importable() -> None:
    """Every name in __all__ exists and the list is sorted."""
    assert reach_plugins.__all__ == sorted(reach_plugins.__all__)
    for name in reach_plugins.__all__:
        assert getattr(reach_plugins, name) is not None


def test_contract_names_are_exported() -> None:
    """DESIGN.md section 9 imports work from the top-level package."""
    from reach_plugins import AgentDescriptor, Capability, ReachClient, ReachRequest, ReachResponse, errors

    assert issubclass(errors.UnknownCapability, errors.ReachError)
    assert {AgentDescriptor, Capability, ReachClient, ReachRequest, ReachResponse}


def test_import_pulls_in_no_framework_or_extra() -> None:
    """`import reach_plugins` (and building a client's records) imports no framework and no optional dependency."""
    code = (
        "import sys, json, reach_plugins, reach_plugins.config.loader, reach_plugins.registry, reach_plugins.routing;"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    loaded = set(json.loads(subprocess.check_output([sys.executable, "-c", code], text=True)))
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))
