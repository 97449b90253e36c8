"""What per-hop tokens and mutual TLS cost (DESIGN.md 11.4), side by side with the same run without them.

Micro figures (in process, p50 over many iterations): signing a token,
a client's cached-token lookup, an agent's verification of a new token
(signature) and of a token it has seen (its cache). End-to-end figures: a
``ReachClient`` calling one trivial agent served by uvicorn in a child
process, sequentially, in three set-ups — plain HTTP without tokens, plain
HTTP with tokens (the client's cached token, the agent's verification), and
mutual TLS with tokens (an L1 agent) — on warm pooled connections; plus the
cost of opening one connection, plain TCP vs TLS with client certificates.
Modes run back to back for several rounds; figures are medians over rounds.
Results go to ``benchmarks/results/tokens.json``.

    .venv/bin/python benchmarks/bench_tokens.py [--calls 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "tokens.json"


def serve(port: int, tokens: bool, tls_dir: str | None) -> None:
    """Child process: a trivial agent, verifying tokens of the key in $REACH_ISSUER_KEYS when asked."""
    from reach_plugins.agent import ReachAgent, mtls
    from reach_plugins.agent import serve as serve_agent
    from reach_plugins.security import KeyRing, TokenIssuer

    verifier = TokenIssuer(KeyRing.load()).verifier() if tokens else None
    agent = ReachAgent("bench", tokens=verifier, trust="L1" if tls_dir else "L2")

    @agent.capability("query_order")
    def query_order(order_id: str) -> dict[str, str]:
        return {"order_id": order_id, "status": "shipped"}

    options = mtls(f"{tls_dir}/server.pem", f"{tls_dir}/server-key.pem", f"{tls_dir}/ca.pem") if tls_dir else {}
    serve_agent(agent, port=port, **options)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def p50_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1000


def micro(iterations: int) -> dict[str, float]:
    """Issue, client cache hit, verify new token, verify seen token: p50 microseconds."""
    from reach_plugins.security import LocalTokens, TokenIssuer

    issuer = TokenIssuer()
    tokens = LocalTokens(issuer)
    verifier = issuer.verifier()

    def timed(step: Callable[[], Any]) -> float:
        samples = []
        for _ in range(iterations):
            began = time.perf_counter_ns()
            step()
            samples.append(time.perf_counter_ns() - began)
        return p50_us(samples)

    async def run() -> dict[str, float]:
        await tokens.token("bench", "alpha")
        loop_samples = []
        for _ in range(iterations):
            began = time.perf_counter_ns()
            await tokens.token("bench", "alpha")
            loop_samples.append(time.perf_counter_ns() - began)
        fresh = [issuer.for_tenant("alpha", "bench").token for _ in range(iterations)]
        new_samples, seen_samples = [], []
        for token in fresh:
            began = time.perf_counter_ns()
            await verifier.verify(token, audience="bench")
            new_samples.append(time.perf_counter_ns() - began)
        for _ in range(iterations):
            began = time.perf_counter_ns()
            await verifier.verify(fresh[0], audience="bench")
            seen_samples.append(time.perf_counter_ns() - began)
        return {
            "issue_us": timed(lambda: issuer.for_tenant("alpha", "bench")),
            "client_cache_hit_us": p50_us(loop_samples),
            "verify_new_token_us": p50_us(new_samples),
            "verify_seen_token_us": p50_us(seen_samples),
        }

    return asyncio.run(run())


def make_pki(folder: Path) -> None:
    import trustme

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    for name, host in (("server", "127.0.0.1"), ("client", "bench-client")):
        leaf = ca.issue_cert(host)
        leaf.private_key_pem.write_to_path(str(folder / f"{name}-key.pem"))
        (folder / f"{name}.pem").write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))


def start(tokens: bool, tls_dir: str | None, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [sys.executable, __file__, "--serve", str(port), "--tokens", str(int(tokens))]
    if tls_dir:
        command += ["--tls", tls_dir]
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    scheme = "https" if tls_dir else "http"
    url = f"{scheme}://127.0.0.1:{port}"
    context = ssl.create_default_context(cafile=f"{tls_dir}/ca.pem") if tls_dir else None
    if context is not None:
        context.load_cert_chain(f"{tls_dir}/client.pem", f"{tls_dir}/client-key.pem")
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/healthz", timeout=1, context=context)
            return child, url
        except OSError:
            if time.monotonic() > deadline:
                child.kill()
                raise RuntimeError(f"the agent at {url} did not start") from None
            time.sleep(0.1)


async def end_to_end(url: str, calls: int, tokens: bool, tls_dir: str | None, key_pem: str) -> float:
    """p50 microseconds of ``ReachClient.reach`` to the agent at ``url``, warm."""
    from reach_plugins.client.client import ReachClient
    from reach_plugins.model import AgentDescriptor
    from reach_plugins.registry import MemoryRegistry
    from reach_plugins.security import KeyRing, LocalTokens, TokenIssuer

    auth: dict[str, Any] = {}
    if tls_dir:
        auth = {
            "type": "cert",
            "client_cert": f"{tls_dir}/client.pem",
            "client_key": f"{tls_dir}/client-key.pem",
            "ca_file": f"{tls_dir}/ca.pem",
        }
    registry = MemoryRegistry()
    trust = "L1" if tls_dir else "L2"
    registry.put_agent(
        AgentDescriptor(name="bench", endpoints=[url], capabilities=["query_order"], auth=auth, trust=trust)
    )
    source = LocalTokens(TokenIssuer(KeyRing.load(environ={"REACH_ISSUER_KEYS": key_pem}))) if tokens else False
    samples = []
    async with ReachClient(registry, tenant="alpha", tokens=source) as client:
        for index in range(calls + 50):
            began = time.perf_counter_ns()
            reply = await client.reach("query_order", {"order_id": f"A{index}"})
            elapsed = time.perf_counter_ns() - began
            if reply.status != "success":
                raise RuntimeError(f"the benchmark call failed: {reply.error}")
            if index >= 50:
                samples.append(elapsed)
    return p50_us(samples)


def connect_cost(url: str, tls_dir: str | None, count: int) -> float:
    """p50 microseconds to open one connection (TCP, plus the TLS handshake with a client certificate)."""
    port = int(url.rsplit(":", 1)[1])
    context = None
    if tls_dir:
        context = ssl.create_default_context(cafile=f"{tls_dir}/ca.pem")
        context.load_cert_chain(f"{tls_dir}/client.pem", f"{tls_dir}/client-key.pem")
    samples = []
    for _ in range(count):
        began = time.perf_counter_ns()
        raw = socket.create_connection(("127.0.0.1", port))
        conn = context.wrap_socket(raw, server_hostname="127.0.0.1") if context else raw
        samples.append(time.perf_counter_ns() - began)
        conn.close()
    return p50_us(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--micro", type=int, default=5000)
    parser.add_argument("--serve", type=int)
    parser.add_argument("--tokens", type=int, default=0)
    parser.add_argument("--tls")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, bool(args.tokens), args.tls)
        return

    from reach_plugins.security import SigningKey

    micro_rounds = [micro(args.micro) for _ in range(args.rounds)]
    micro_figures = {key: statistics.median(r[key] for r in micro_rounds) for key in micro_rounds[0]}

    key_pem = SigningKey.generate().pem().decode()
    env = {**os.environ, "REACH_ISSUER_KEYS": key_pem}
    modes = {"plain": (False, False), "tokens": (True, False), "mtls_tokens": (True, True)}
    per_round: dict[str, list[float]] = {mode: [] for mode in modes}
    connects: dict[str, list[float]] = {"tcp": [], "mtls": []}
    with tempfile.TemporaryDirectory(prefix="reach-bench-tls-") as folder:
        make_pki(Path(folder))
        for _ in range(args.rounds):
            for mode, (tokens, tls) in modes.items():
                tls_dir = folder if tls else None
                child, url = start(tokens, tls_dir, env)
                try:
                    per_round[mode].append(asyncio.run(end_to_end(url, args.calls, tokens, tls_dir, key_pem)))
                    if mode != "tokens":
                        connects["mtls" if tls else "tcp"].append(connect_cost(url, tls_dir, 200))
                finally:
                    child.kill()
                    child.wait()
    calls = {mode: statistics.median(values) for mode, values in per_round.items()}
    connect = {kind: statistics.median(values) for kind, values in connects.items()}
    report = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "settings": {"calls": args.calls, "rounds": args.rounds, "micro_iterations": args.micro},
        "micro_us_p50": micro_figures,
        "call_us_p50": calls,
        "tokens_added_per_call_us": calls["tokens"] - calls["plain"],
        "mtls_added_per_call_us": calls["mtls_tokens"] - calls["tokens"],
        "connect_us_p50": connect,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'micro (p50)':<34}{'µs':>10}")
    for key, value in micro_figures.items():
        print(f"  {key:<32}{value:>10.1f}")
    print(f"{'ReachClient.reach, warm (p50)':<34}{'µs':>10}")
    for key, value in calls.items():
        print(f"  {key:<32}{value:>10.1f}")
    print(f"  {'tokens added':<32}{report['tokens_added_per_call_us']:>10.1f}")
    print(f"  {'mTLS added (warm connection)':<32}{report['mtls_added_per_call_us']:>10.1f}")
    print(f"{'opening a connection (p50)':<34}{'µs':>10}")
    for key, value in connect.items():
        print(f"  {key:<32}{value:>10.1f}")
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()
