"""The ``reach`` command: the demo, and the operator's view of a registry."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from reach_plugins.config.loader import load_config
from reach_plugins.endpoints import EndpointPolicy
from reach_plugins.errors import ConfigError, ReachError
from reach_plugins.fleet import Fleet, load_fleet
from reach_plugins.registry import Registry, open_registry
from reach_plugins.routing.probes import Prober
from reach_plugins.routing.status import judge
from reach_plugins.security.keys import SigningKey
from reach_plugins.server.tls import ServerTls
from reach_plugins.telemetry.logs import FORMATS, LEVELS, reach_version
from reach_plugins.telemetry.trace import TRACE_BACKUPS, TRACE_MAX_BYTES
from reach_plugins.telemetry.traceview import find_trace, follow, follow_url, terminal_text, trace_tree
from reach_plugins.telemetry.usage import read_traces, summarise

app = typer.Typer(help="Reach other agents by capability.", no_args_is_help=True, add_completion=False)
console = Console()
TRACES = Path("reach-traces.jsonl")
"""Where ``reach demo`` writes its traces and ``reach trace`` reads them unless told otherwise."""
TlsCert = Annotated[Path | None, typer.Option(help="Serve TLS with this certificate chain (PEM).")]
TlsKey = Annotated[Path | None, typer.Option(help="The private key of --tls-cert (PEM, unencrypted).")]
ClientCa = Annotated[Path | None, typer.Option(help="Require client certificates of this CA (mutual TLS).")]
TraceFile = Annotated[
    Path | None, typer.Option(help="Write each request's trace here (JSON lines; `reach trace`, `reach usage`).")
]
TraceMaxBytes = Annotated[int, typer.Option(min=1, help="Rotate --trace-file past this size (bytes).")]
TraceBackups = Annotated[int, typer.Option(min=0, help="Rotated --trace-file copies kept (PATH.1, PATH.2, ...).")]
LogFormat = Annotated[str, typer.Option(help=f"Log lines as {' or '.join(FORMATS)} (JSON: one object a line).")]
LogLevel = Annotated[str, typer.Option(help=f"Log this level and above: {', '.join(LEVELS)}.")]
AgentToken = Annotated[
    list[str],
    typer.Option(help="NAME=ENV: agent NAME exchanges the tokens it receives with the token in $ENV; repeatable."),
]


def _show_version(shown: bool) -> None:
    if shown:
        console.print(f"reach {reach_version()}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Reach other agents by capability."""


def _ports(**ports: int | None) -> None:
    """``ConfigError`` naming the option whose value is no TCP port (0 picks a free one), instead of listening
    on the value modulo 65536 as the socket layer would."""
    for option, port in ports.items():
        if port is not None and not 0 <= port <= 65535:
            name = "--" + option.replace("_", "-")
            raise ConfigError(f"{name} {port}: a port is a number from 1 to 65535 (or 0 for a free one)")


def _tls(cert: Path | None, key: Path | None, client_ca: Path | None) -> dict[str, str]:
    """The TLS keywords of a server's ``serve`` function, checked now (files load, nothing half given)."""
    ServerTls.given(cert, key, client_ca)
    named = {"tls_cert": cert, "tls_key": key, "client_ca": client_ca}
    return {name: str(path) for name, path in named.items() if path is not None}


@contextmanager
def _named_errors() -> Iterator[None]:
    """A ReachError ends the command with its message (which says what to fix) and exit code 2, no traceback."""
    try:
        yield
    except ReachError as exc:
        console.print("[red]error:[/red]", escape(str(exc)))
        raise typer.Exit(2) from None


@app.command()
def demo(
    seed: Annotated[int, typer.Option(help="Random seed of the scripted run.")] = 7,
    trace_file: Annotated[Path, typer.Option(help="Write each request's trace here (JSON lines).")] = TRACES,
) -> None:
    """Run the customer-service scenario on the embedded default: no servers, no API key."""
    try:
        from reach_plugins.demo import run_demo
    except ImportError as exc:
        console.print(f'[red]the demo needs the demo extra:[/red] pip install "reach-plugins[demo]" ({exc})')
        raise typer.Exit(2) from None

    asyncio.run(run_demo(console, seed=seed, trace_file=trace_file))


@app.command()
def agents(
    registry: Annotated[
        str | None, typer.Option(help="Registry URL: memory://, file://agents.yaml, etcd://host:port.")
    ] = None,
    load: Annotated[Path | None, typer.Option(help="Upsert the agents of this YAML file first.")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the same data as JSON.")] = False,
    probe: Annotated[bool, typer.Option(help="Probe each instance's liveness now, as a gateway would.")] = True,
    loops: Annotated[
        str | None, typer.Option(metavar="GATEWAY_URL", help="List the dependency loops this gateway sees instead.")
    ] = None,
    token_env: Annotated[str, typer.Option(help="Variable holding the tenant token --loops presents.")] = "REACH_TOKEN",
) -> None:
    """List agents and, per instance, what a router would decide now (lease, probe) and why; --load upserts first.

    With ``--loops GATEWAY_URL``: the agent pairs that gateway sees reaching each other too often (``GET /v1/loops``).
    """
    with _named_errors():
        if loops is not None:
            _loops(loops, os.environ.get(token_env), as_json=json_)
        elif registry is None:
            raise ConfigError("reach agents needs --registry URL (or --loops GATEWAY_URL for the dependency loops)")
        else:
            asyncio.run(_agents(registry, load, as_json=json_, probe=probe))


@app.command()
def usage(
    traces: Annotated[Path, typer.Argument(help="A JSON-lines trace file (JsonLinesSink).")],
    since: Annotated[str | None, typer.Option(help="From this time (ISO 8601, e.g. 2026-12-01T09:00).")] = None,
    until: Annotated[str | None, typer.Option(help="Up to this time, excluded (ISO 8601).")] = None,
) -> None:
    """Calls and tokens per tenant, agent and capability, summed from a trace file over a time range."""
    try:
        rows = summarise(read_traces(traces), since=_epoch(since), until=_epoch(until))
    except (OSError, ValueError) as exc:
        console.print("[red]error:[/red]", escape(str(exc)))
        raise typer.Exit(2) from None
    table = Table("tenant", "agent", "capability", "calls", "ok", "tokens", "of which estimated", title="usage")
    for row in rows:
        table.add_row(
            terminal_text(row.tenant),
            terminal_text(row.agent),
            terminal_text(row.capability),
            str(row.calls),
            str(row.succeeded),
            str(row.tokens),
            str(row.estimated_tokens),
        )
    console.print(table)


def _epoch(when: str | None) -> float | None:
    """Epoch seconds of an ISO 8601 time (UTC when it names no zone)."""
    if when is None:
        return None
    moment = datetime.fromisoformat(when)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


@app.command()
def gateway(
    config: Annotated[Path, typer.Option(help="YAML with tenants (tokens, allow-lists, credentials) and agents.")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    registry: Annotated[str | None, typer.Option(help="Take agents from this registry URL instead.")] = None,
    allow_open: Annotated[bool, typer.Option(help="Serve without tenants: anyone, as any tenant.")] = False,
    issuer_key: Annotated[list[Path], typer.Option(help="Token signing key (PEM), newest first; repeatable.")] = [],  # noqa: B006
    agent_token: AgentToken = [],  # noqa: B006
    audit: Annotated[str | None, typer.Option(help="Content audit URL for L3 agents (else they are refused).")] = None,
    workers: Annotated[int, typer.Option(help="Processes serving the port, restarted if they die.")] = 1,
    dedup_store: Annotated[
        str | None, typer.Option(help="Idempotency store URL (redis://HOST:PORT/DB); needed with --workers > 1.")
    ] = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    client_ca: ClientCa = None,
    metrics_token_env: Annotated[
        str | None, typer.Option(help="Variable holding the bearer token /metrics requires (shows tenant names).")
    ] = None,
    metrics_port: Annotated[int | None, typer.Option(help="Serve /metrics on this port instead (one worker).")] = None,
    metrics_host: Annotated[str, typer.Option(help="Address of --metrics-port.")] = "127.0.0.1",
    trace_file: TraceFile = None,
    trace_max_bytes: TraceMaxBytes = TRACE_MAX_BYTES,
    trace_backups: TraceBackups = TRACE_BACKUPS,
    log_format: LogFormat = "text",
    log_level: LogLevel = "info",
) -> None:
    """Serve the Reach gateway (HTTP): POST /v1/reach(/stream), GET /v1/agents, /v1/loops, /metrics, tokens + JWKS."""
    from reach_plugins.gateway import serve_gateway
    from reach_plugins.gateway.workers import serve_workers

    if metrics_port is not None and workers > 1:
        console.print("[red]error:[/red] --metrics-port serves one process's metrics; use it with --workers 1")
        raise typer.Exit(2)
    options: dict[str, Any] = {"registry": registry, "allow_open": allow_open, "audit": audit, "store": dedup_store}
    options.update(metrics_token_env=metrics_token_env, metrics_port=metrics_port, metrics_host=metrics_host)
    options.update(_trace_options(trace_file, trace_max_bytes, trace_backups))
    options.update(log_format=log_format, log_level=log_level)
    with _named_errors():
        _ports(port=port, metrics_port=metrics_port)
        options |= _tls(tls_cert, tls_key, client_ca)
        options["agent_tokens"] = _pairs(agent_token, "--agent-token")
        if workers == 1:
            serve_gateway(config, host, port, issuer_keys=issuer_key, **options)
        else:
            keys = [str(key) for key in issuer_key]
            serve_workers(workers, host, port, {"config": str(config), "issuer_keys": keys, **options})


@app.command()
def node(
    config: Annotated[Path, typer.Option(help="YAML with tenants (tokens, allow-lists, credentials) and agents.")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 50051,
    registry: Annotated[str | None, typer.Option(help="Take agents from this registry URL instead.")] = None,
    queue_capacity: Annotated[int, typer.Option(help="Requests that may wait for a worker.")] = 1000,
    workers: Annotated[int, typer.Option(help="Requests served at once.")] = 64,
    node_id: Annotated[str | None, typer.Option(help="Name in x-reach-via chains (default: random).")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="Serve /metrics (Prometheus) over HTTP here.")] = None,
    metrics_token_env: Annotated[
        str | None, typer.Option(help="Variable holding the bearer token /metrics requires (shows tenant names).")
    ] = None,
    allow_open: Annotated[bool, typer.Option(help="Serve without tenants: anyone, as any tenant.")] = False,
    callback_host: Annotated[
        list[str] | None, typer.Option(help="host or host:port that Submit callbacks may reach (repeat).")
    ] = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    client_ca: ClientCa = None,
    trace_file: TraceFile = None,
    trace_max_bytes: TraceMaxBytes = TRACE_MAX_BYTES,
    trace_backups: TraceBackups = TRACE_BACKUPS,
    log_format: LogFormat = "text",
    log_level: LogLevel = "info",
) -> None:
    """Serve a Reach node (gRPC): Call, Stream, Submit/Result, with a bounded priority queue."""
    from reach_plugins.node import run_node

    with _named_errors():
        _ports(port=port, metrics_port=metrics_port)
        run_node(
            config,
            host,
            port,
            registry=registry,
            queue_capacity=queue_capacity,
            workers=workers,
            node_id=node_id,
            metrics_port=metrics_port,
            metrics_token_env=metrics_token_env,
            allow_open=allow_open,
            callback_hosts=callback_host or (),
            log_format=log_format,
            log_level=log_level,
            **_tls(tls_cert, tls_key, client_ca),
            **_trace_options(trace_file, trace_max_bytes, trace_backups),
        )


@app.command()
def issuer(
    config: Annotated[Path | None, typer.Option(help="YAML with tenants (tokens, allow-lists).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8090,
    key: Annotated[list[Path], typer.Option(help="Signing key (PEM), newest first; repeatable.")] = [],  # noqa: B006
    name: Annotated[str, typer.Option(help="The tokens' 'iss' claim.")] = "reach",
    ttl: Annotated[float, typer.Option(help="Token lifetime in seconds (at most 900).")] = 300.0,
    new_key: Annotated[Path | None, typer.Option(help="Write a fresh Ed25519 key (PEM) here and exit.")] = None,
    agent_token: AgentToken = [],  # noqa: B006
    allow_open: Annotated[bool, typer.Option(help="Serve without tenants: tokens for anyone, as any tenant.")] = False,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    client_ca: ClientCa = None,
) -> None:
    """Serve the token issuer: POST /v1/tokens (tenants and agents), GET /.well-known/jwks.json."""
    if new_key is not None:
        new_key.write_bytes(SigningKey.generate().pem())
        new_key.chmod(0o600)
        console.print(f"wrote a new signing key to {new_key}")
        return
    if config is None:
        console.print("[red]error:[/red] give --config (the tenants' tokens and allow-lists), or --new-key PATH")
        raise typer.Exit(2)
    from reach_plugins.server.issuer_server import serve_issuer

    with _named_errors():
        _ports(port=port)
        agents = _pairs(agent_token, "--agent-token")
        tls = _tls(tls_cert, tls_key, client_ca)
        serve_issuer(
            config, host, port, keys=key, name=name, ttl=ttl, agent_tokens=agents, allow_open=allow_open, **tls
        )


def _trace_options(path: Path | None, max_bytes: int, backups: int) -> dict[str, Any]:
    """The trace-file keywords of a server's ``serve`` function (none without ``--trace-file``)."""
    if path is None:
        return {}
    return {"trace_file": str(path), "trace_max_bytes": max_bytes, "trace_backups": backups}


@app.command()
def ops(
    registry: Annotated[str, typer.Option(help="Registry URL of the fleet: file://agents.yaml, etcd://host:port.")],
    token_env: Annotated[str, typer.Option(help="Variable holding the operator token the page asks for.")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8070,
    trace_file: Annotated[Path, typer.Option(help="The clients' JSON-lines trace file (recent reaches).")] = TRACES,
) -> None:
    """Serve the operations page of a direct-transport fleet: GET /ops (open the page with #token=<token>)."""
    from reach_plugins.gateway import serve_ops

    with _named_errors():
        _ports(port=port)
        serve_ops(registry, host, port, token_env=token_env, trace_file=trace_file)


@app.command()
def up(
    fleet: Annotated[Path, typer.Argument(help="A fleet file (see examples/fleet.yaml).")],
) -> None:
    """Start a local fleet: secured etcd, Redis, agent instances, a gateway with workers, a node; Ctrl-C stops it."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops the fleet as Ctrl-C does
    with _named_errors():
        running = Fleet(load_fleet(fleet))
        try:
            table = Table("process", "listens on", title=f"reach up {fleet}")
            for what, where in running.up():
                table.add_row(what, where)
            console.print(table)
            console.print(f"logs, certificates and tokens.env under {running.spec.state}; Ctrl-C stops everything")
            while True:
                signal.pause()
        except KeyboardInterrupt:
            pass
        finally:
            running.down()
        console.print("stopped")


def _pairs(values: list[str], option: str) -> dict[str, str]:
    """``NAME=VALUE`` options as a dict (``ConfigError`` naming the option for anything else)."""
    pairs: dict[str, str] = {}
    for value in values:
        name, equals, rest = value.partition("=")
        if not equals or not name or not rest:
            raise ConfigError(f"{option} {value!r}: write NAME=ENV_VARIABLE")
        pairs[name] = rest
    return pairs


@app.command()
def trace(
    request_id: Annotated[str | None, typer.Argument(help="The request to show (a unique prefix will do).")] = None,
    file: Annotated[Path, typer.Option(help="JSON-lines trace file (a JsonLinesSink's).")] = TRACES,
    tail: Annotated[bool, typer.Option(help="Follow the file and show each new request as it is written.")] = False,
    follow_: Annotated[
        str | None, typer.Option("--follow", help="Follow a live gateway (its URL): recent requests, then new ones.")
    ] = None,
    token_env: Annotated[
        str | None, typer.Option(help="With --follow: the variable holding the gateway's metrics token.")
    ] = None,
    count: Annotated[int | None, typer.Option(help="With --tail or --follow: stop after this many requests.")] = None,
) -> None:
    """Replay one request's route decision (candidates, scores, pick, reason) and attempts as a timed tree."""
    if [tail, request_id is not None, follow_ is not None].count(True) != 1:
        console.print("[red]error:[/red] give a REQUEST_ID, or --tail to follow new requests, or --follow URL")
        raise typer.Exit(2)
    if request_id is not None:
        with _named_errors():
            console.print(trace_tree(find_trace(file, request_id)))
        return
    if follow_ is not None:
        token = os.environ.get(token_env) if token_env else None
        where = follow_
        records = follow_url(follow_, token, ready=lambda: console.print(f"[dim]following {escape(where)}[/dim]"))
    else:
        records = follow(file, ready=lambda: console.print(f"[dim]following {escape(str(file))}[/dim]"))
    with _named_errors():
        for shown, record in enumerate(records, start=1):
            console.print(trace_tree(record))
            if count is not None and shown >= count:
                return


async def _agents(url: str, load: Path | None, *, as_json: bool, probe: bool) -> None:
    endpoints = EndpointPolicy.from_environ(os.environ)
    reg = open_registry(url, endpoints=endpoints)
    prober = Prober(reg)
    try:
        if load is not None:
            for descriptor in load_config(load, endpoints=endpoints).agents:
                await reg.register_agent(descriptor)
            if not as_json:
                console.print(f"loaded {load} into {url}")
        if probe:
            logging.getLogger("reach_plugins.routing.probes").setLevel(logging.ERROR)  # the table says it
            await prober.sweep()
        listed = _agent_statuses(reg, prober)
        if as_json:
            print(json.dumps(listed, indent=2))
        else:
            console.print(_agents_table(listed))
    finally:
        await prober.aclose()
        await reg.aclose()


def _loops(url: str, token: str | None, *, as_json: bool) -> None:
    """Print the pairs of ``GET {url}/v1/loops`` (as JSON, or a table)."""
    route = url.rstrip("/") + "/v1/loops"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        answer = httpx.get(route, headers=headers, timeout=10.0)
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot reach {route}: {type(exc).__name__}: {exc}; is the gateway up?") from None
    if answer.status_code != 200:
        raise ConfigError(f"GET {route} answered {answer.status_code}: {answer.text[:300]}")
    pairs: list[dict[str, Any]] = answer.json()["loops"]
    if as_json:
        print(json.dumps(pairs, indent=2))
        return
    table = Table("agents", "two-way rate /s", "forward /s", "backward /s", "newer direction", title="dependency loops")
    for pair in pairs:
        cells = (" <-> ".join(pair["pair"]), str(pair["rate"]), str(pair["forward"]), str(pair["backward"]))
        table.add_row(*(terminal_text(cell) for cell in (*cells, pair["newer"])))
    console.print(table if pairs else "no dependency loops")


def _agent_statuses(reg: Registry, prober: Prober) -> list[dict[str, Any]]:
    """Every agent with what a router would decide about each instance now (no breakers: none live here)."""
    now, probed = reg.clock(), prober.now()
    listed = []
    for name, descriptor in sorted(reg.agents().items()):
        instances = []
        for inst in reg.instances(name).values():
            last = prober.book.last(name, inst.instance_id)
            found = judge(inst, now, alive=reg.is_alive(inst, now), probe=last, probe_now=probed)
            instances.append({**found.as_json(), "endpoint": inst.endpoint})
        capabilities = [cap.name for cap in descriptor.capabilities]
        listed.append({"name": name, "capabilities": capabilities, "instances": instances})
    return listed


def _agents_table(listed: list[dict[str, Any]]) -> Table:
    table = Table(title="agents")
    for column in ("agent", "capabilities", "instance", "endpoint", "status", "lease", "probe", "routing"):
        table.add_column(column)
    for agent in listed:
        name, caps = agent["name"], ", ".join(agent["capabilities"])
        if not agent["instances"]:
            table.add_row(terminal_text(name), terminal_text(caps), "-", "-", "-", "-", "-", "no instance")
        for inst in agent["instances"]:
            lease = "alive" if inst["lease"]["alive"] else "[red]expired[/red]"
            probe = inst["probe"]
            probed = "-" if probe is None else ("ok" if probe["ok"] else f"[red]failed[/red] ({escape(probe['why'])})")
            why = inst["reason"]
            routing = "[green]available[/green]" if why is None else f"[red]unavailable:[/red] {escape(why)}"
            row = (name, caps, inst["instance_id"], inst["endpoint"], inst["status"])
            table.add_row(*(terminal_text(cell) for cell in row), lease, probed, routing)
            name, caps = "", ""
    return table


def main() -> None:
    app()


if __name__ == "__main__":
    main()
