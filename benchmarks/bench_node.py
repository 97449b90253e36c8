"""Where a request's work goes in the Reach node, measured in ways a shared, loaded machine does not skew.

Two parts:

* In-process, per call (best of several batches): the node's own work around
  the forwarder (``NodeService.Call`` behind the node's gate, message as bytes,
  with a canned forwarder: metadata, token, strict payload decoding, body rules, request build, reply message), the
  forwarder itself with the agent transport replaced by an in-memory one (core
  + token/audit/hop wrappers), and the client side's codec
  (``GrpcNodeTransport``'s metadata, message and reply).
* ``--callgrind`` (needs valgrind): instructions per request in the node
  process, counted by callgrind around a fixed number of calls at concurrency
  8, for the whole node, the node with a canned forwarder, the node with the
  agent transport canned, and a bare grpc.aio echo server (the floor any gRPC
  hop pays). Instruction counts repeat to within 1 % however busy the machine
  is, unlike CPU time, so they show what a change saved.

Results go to ``benchmarks/results/node.json``.

    .venv/bin/python benchmarks/bench_node.py [--callgrind] [--requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvloop
from bench_hops import AGENT, ENV, TOKEN, client_path, config_file, free_port, loaded, start, wait_port

from reach_plugins import ReachClient
from reach_plugins.config.loader import load_config
from reach_plugins.model import AgentDescriptor, ReachRequest, ReachResponse
from reach_plugins.node import NodeService, Tickets, WorkQueue
from reach_plugins.node.gate import AuthFirst
from reach_plugins.node.server import SERVICE
from reach_plugins.registry import FileRegistry
from reach_plugins.server.access import Access
from reach_plugins.server.forwarder import Forwarder
from reach_plugins.server.issuer_role import agent_transport, build_issuer
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.transport import Call, Reply
from reach_plugins.wire import protocodec as codec
from reach_plugins.wire.headers import SOURCE
from reach_plugins.wire.proto import reach_pb2 as pb
from transports.grpcnode import GrpcNodeTransport

RESULTS = Path(__file__).parent / "results" / "node.json"
METADATA = (
    ("x-reach-hops", "orders/echo"),
    ("x-tenant", "bench"),
    ("x-reach-deadline", "10000"),
    ("authorization", f"Bearer {TOKEN}"),
    ("user-agent", "grpc-python-asyncio"),
)
"""What a ReachClient's GrpcNodeTransport sends, less the instance pin (the canned forwarder routes nothing)."""

CANNED_FORWARDER = """
import reach_plugins.server.forwarder as forwarder
from reach_plugins.model import ReachResponse
CANNED = ReachResponse(request_id="r", status="success", data={"order_id": "A1"}, agent="orders", attempts=1)
async def run(self, request):
    return CANNED
forwarder.Forwarder.run = run
"""
CANNED_AGENT = """
import transports.direct.transport as direct
from reach_plugins.transport import Reply
async def send(self, call):
    return Reply(status="success", data={"order_id": "A1"}, agent=call.agent.name, instance=call.instance.instance_id)
direct.DirectTransport.send = send
"""
NODE = "from reach_plugins.cli import main; main()"
ECHO = """
import sys
import grpc, uvloop
from reach_plugins.wire.proto import reach_pb2, reach_pb2_grpc

class Echo(reach_pb2_grpc.ReachNodeServicer):
    async def Call(self, request, context):
        result = reach_pb2.Result(request_id=request.request_id, status=reach_pb2.SUCCESS, data=b'{"order_id":"A1"}')
        return reach_pb2.CallReply(result=result)

async def main():
    server = grpc.aio.server()
    reach_pb2_grpc.add_ReachNodeServicer_to_server(Echo(), server)
    server.add_insecure_port(f"127.0.0.1:{sys.argv[-1]}")
    await server.start()
    await server.wait_for_termination()

uvloop.run(main())
"""
SERVERS = {
    "node": NODE,
    "node_canned_agent_transport": CANNED_AGENT + NODE,
    "node_canned_forwarder": CANNED_FORWARDER + NODE,
    "grpc_aio_echo": ECHO,
}


class CannedForwarder(Forwarder):
    """A forwarder that answers at once: what is left is the node's own work around it."""

    async def run(self, request: ReachRequest) -> ReachResponse:
        return ReachResponse(request_id=request.request_id, status="success", data={"order_id": "A1"}, agent="orders")


class Context:
    """The parts of ``grpc.aio.ServicerContext`` the node reads on a successful call."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return METADATA

    def time_remaining(self) -> float:
        return 9.99

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"


class CannedAgents:
    """The agent transport inside the node's forwarder, answering at once."""

    owns_retries = False
    hop = None

    async def send(self, call: Call) -> Reply:
        return Reply(
            status="success", data={"order_id": "A1"}, agent=call.agent.name, instance=call.instance.instance_id
        )

    async def aclose(self) -> None:
        return None


async def per_call(run: Callable[[], Awaitable[Any]], *, calls: int = 2000, batches: int = 7) -> float:
    """Microseconds per call: the best batch (the one least disturbed by other work on the machine)."""
    for _ in range(calls // 4):
        await run()
    best = float("inf")
    for _ in range(batches):
        began = time.perf_counter()
        for _ in range(calls):
            await run()
        best = min(best, (time.perf_counter() - began) / calls * 1e6)
    return round(best, 2)


async def in_process(directory: Path) -> dict[str, float]:
    """Per-call microseconds of the node's own work, of its forwarder, and of the client side's codec."""
    config = config_file(directory, 9)
    tenants = load_config(config).tenants
    agents = agent_transport(build_issuer(tenants, environ=ENV), via=None, inner=CannedAgents())
    forwarder = Forwarder(FileRegistry(config), tenants=tenants, environ=ENV, direct=agents, owns_registry=True)
    canned = CannedForwarder(FileRegistry(config), tenants=tenants, environ=ENV, owns_registry=True)
    tickets = Tickets(budget=DEFAULT_BUDGET)
    service = NodeService(canned, Access(tenants, ENV), queue=WorkQueue(), tickets=tickets, node_id="bench")
    message = pb.ReachCall(request_id="r", capability="echo", payload=b'{"order_id":"A1"}', deadline_ms=10_000)
    context = Context()
    gate = AuthFirst(service.access, service.refuse, node_id="bench", service=SERVICE)
    call, sent = gate.unary("Call", service.Call, pb.ReachCall, pb.CallReply).unary_unary, message.SerializeToString()
    request = ReachRequest(
        capability="echo", payload={"order_id": "A1"}, tenant="bench", timeout_ms=10_000, metadata={SOURCE: "127.0.0.1"}
    )
    await forwarder.start()
    try:
        figures = {
            "node_service_call_canned_forwarder_us": await per_call(lambda: call(sent, context)),
            "forwarder_run_canned_agents_us": await per_call(lambda: forwarder.run(request)),
        }
    finally:
        await forwarder.aclose()
        await canned.aclose()
    agent = AgentDescriptor(name="orders", endpoints=["grpc://127.0.0.1:1"], capabilities=["echo"])
    headers = {"X-Reach-Hops": "orders/echo", "X-Tenant": "bench", "X-Reach-Retry": "upstream"}
    call = Call(request=request, agent=agent, instance=agent.static_instances()[0], timeout=10.0, headers=headers)
    reply = pb.CallReply(result=pb.Result(request_id="r", status=pb.SUCCESS, data=b'{"order_id":"A1"}', attempts=1))

    async def client_codec() -> None:
        codec.call_metadata(call, TOKEN)
        codec.call_message(call).SerializeToString()
        codec.reply_from_result(call, pb.CallReply.FromString(reply.SerializeToString()).result)

    figures["client_codec_per_call_us"] = await per_call(client_codec)
    return figures


async def drive(server: str, directory: Path, requests: int, out: str) -> int:
    """Start the agent and ``server`` (under callgrind, counting off), count ``requests`` node calls; how many ran."""
    processes: list[subprocess.Popen[str]] = []
    try:
        agent_port, port = free_port(), free_port()
        processes.append(start([sys.executable, "-c", AGENT, str(agent_port)], agent_port))
        config = config_file(directory, agent_port)
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p"]
        command += [sys.executable, "-c", SERVERS[server], "node", "--config", str(config), "--port", str(port)]
        process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
        processes.append(process)
        wait_port(port, process, timeout=120)
        transport = GrpcNodeTransport(f"127.0.0.1:{port}", token=TOKEN)
        async with ReachClient(str(config), transport, tenant="bench", environ=ENV) as client:
            call = client_path(client)
            await loaded(call, concurrency=8, requests=200)
            for step in (["-i", "on"], ["-z"]):
                subprocess.run(["callgrind_control", *step, str(process.pid)], check=True, capture_output=True)
            done = await loaded(call, concurrency=8, requests=requests)
            for step in (["-i", "off"], ["-d"]):
                subprocess.run(["callgrind_control", *step, str(process.pid)], check=True, capture_output=True)
        return int(done["requests"])
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)


def counted(out: str) -> int:
    """Instructions in the dumps callgrind wrote to ``out``.* (``totals:`` lines)."""
    total = 0
    for path in glob.glob(f"{out}.*"):
        for line in Path(path).read_text().splitlines():
            if line.startswith("totals:"):
                total += int(line.split()[1])
    return total


async def instructions(directory: Path, requests: int) -> dict[str, int]:
    """Thousands of instructions per request in each server variant (see :data:`SERVERS`)."""
    figures = {}
    for name in SERVERS:
        out = str(directory / f"callgrind-{name}")
        done = await drive(name, directory, requests, out)
        figures[f"{name}_kinstr_per_request"] = round(counted(out) / done / 1000)
        print(f"{name:>30}: {figures[f'{name}_kinstr_per_request']} k instructions per request", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callgrind", action="store_true", help="count instructions per request (needs valgrind)")
    parser.add_argument("--requests", type=int, default=300, help="requests counted per server under callgrind")
    args = parser.parse_args()
    uvloop.install()
    with tempfile.TemporaryDirectory() as directory:
        report: dict[str, Any] = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "load_average_before": [round(x, 2) for x in os.getloadavg()],
            "in_process": asyncio.run(in_process(Path(directory))),
        }
        for key, value in report["in_process"].items():
            print(f"{key:>40}: {value} us", flush=True)
        if args.callgrind:
            if shutil.which("valgrind") is None:
                raise SystemExit("--callgrind needs valgrind (apt-get install valgrind)")
            report["callgrind"] = asyncio.run(instructions(Path(directory), args.requests))
            report["callgrind_settings"] = {"requests": args.requests, "concurrency": 8}
    report["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
