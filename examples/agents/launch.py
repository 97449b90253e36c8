"""What every example agent shares: its capabilities from ``examples/agents.yaml``, its port, its command line.

An agent listed in ``examples/agents.yaml`` takes its capabilities (schemas,
``danger_level``, ``idempotency_key``, ``retryable``...) and its port from
there, so the documented config and the running agent cannot drift apart;
the script only supplies the functions. Every script takes::

    --host 127.0.0.1       address to listen on
    --port N               port (default: the agent's port in examples/agents.yaml)
    --registry URL         register there and keep heartbeats going (reach agents only; default: nowhere)
    --endpoint URL         the address to register (default: http://HOST:PORT)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from reach_plugins.agent import ReachAgent, serve, uvicorn_config
from reach_plugins.config.loader import load_config
from reach_plugins.errors import ConfigError
from reach_plugins.model import AgentDescriptor

CONFIG = Path(__file__).resolve().parent.parent / "agents.yaml"


def configured(name: str) -> AgentDescriptor:
    """Agent ``name`` as ``examples/agents.yaml`` describes it."""
    return load_config(CONFIG).agent(name)


def configured_port(name: str) -> int:
    """The port of agent ``name``'s first endpoint in ``examples/agents.yaml``."""
    port = urlsplit(configured(name).endpoints[0]).port
    if port is None:
        raise ConfigError(f"agent {name!r} in {CONFIG} has no port in its endpoint")
    return port


def from_config(name: str, handlers: Mapping[str, Callable[..., Any]], **options: Any) -> ReachAgent:
    """A ReachAgent offering agent ``name``'s capabilities of ``examples/agents.yaml``, each served by its handler."""
    descriptor = configured(name)
    missing = [cap.name for cap in descriptor.capabilities if cap.name not in handlers]
    extra = sorted(set(handlers) - {cap.name for cap in descriptor.capabilities})
    if missing or extra:
        raise ConfigError(f"agent {name!r}: no handler for {missing}; handlers for unknown capabilities {extra}")
    agent = ReachAgent(
        name, version=descriptor.version, description=descriptor.description, namespace=descriptor.namespace, **options
    )
    for cap in descriptor.capabilities:
        agent.offer(cap)(handlers[cap.name])
    return agent


def _options(description: str, port: int, *, registers: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=port, help="port to listen on (default: %(default)s)")
    if registers:
        parser.add_argument("--registry", help="register in this registry (etcd://host:port/prefix); default: none")
        parser.add_argument("--endpoint", help="the address to register (default: http://HOST:PORT)")
    return parser.parse_args()


def run_agent(agent: ReachAgent, port: int) -> None:
    """Serve ``agent`` from the command line until interrupted; with ``--registry``, registered and heartbeating
    (the agent opens the URL itself, so it starts while the registry is down and registers once it answers)."""
    options = _options(agent.description or f"The {agent.name} agent", port, registers=True)
    registry: str | None = options.registry
    endpoint = options.endpoint or f"http://{options.host}:{options.port}"
    capabilities = ", ".join(cap.name for cap in agent.capabilities)
    where = f", registered in {options.registry}" if registry else ""
    print(f"{agent.name} serves {capabilities} at {endpoint}{where}", flush=True)
    serve(agent, options.host, options.port, registry=registry, endpoint=endpoint)


def health_routes(name: str) -> list[BaseRoute]:
    """``/healthz`` and ``/readyz`` for a fake foreign agent, answered as the agent SDK answers them."""

    async def alive(request: Request) -> Response:
        return JSONResponse({"status": "ready", "agent": name})

    return [Route("/healthz", alive, methods=["GET"]), Route("/readyz", alive, methods=["GET"])]


def run_app(name: str, app: Starlette, port: int, description: str) -> None:
    """Serve a fake foreign agent's app from the command line until interrupted (it registers nowhere)."""
    options = _options(description, port, registers=False)
    print(f"{name} ({description}) listens on http://{options.host}:{options.port}", flush=True)
    uvicorn.Server(uvicorn_config(app, host=options.host, port=options.port)).run()
