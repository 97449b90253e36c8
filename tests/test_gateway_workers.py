"""``reach gateway --workers N`` as real processes: they share one port, a killed one comes back, SIGTERM stops all."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from hop_support import TOKENS, demo_tenants, free_port, serve_agents, until_true, write_config

CLI = "from reach_plugins.cli import main; main()"
AUTH = {"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}"}


def workers_of(supervisor: subprocess.Popen[bytes]) -> set[int]:
    """The pids of the supervisor's child processes now (Linux ``/proc``)."""
    pid = supervisor.pid
    return {int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def worker_answering(url: str) -> int | None:
    """The worker number /healthz reports, on a connection of its own (None while nobody answers)."""
    try:
        async with httpx.AsyncClient() as http:
            answer = await http.get(f"{url}/healthz", timeout=5.0)
    except httpx.TransportError:
        return None
    number: int = answer.json()["worker"]
    return number


async def reach(url: str, order_id: str, key: str | None = None) -> httpx.Response:
    """One POST /v1/reach on a fresh connection (so the kernel may hand it to any worker)."""
    headers = {**AUTH, **({"Idempotency-Key": key} if key else {})}
    body = {"capability": "query_order", "payload": {"order_id": order_id}}
    async with httpx.AsyncClient() as http:
        return await http.post(f"{url}/v1/reach", json=body, headers=headers, timeout=10.0)


async def both_workers_answer(supervisor: subprocess.Popen[bytes], url: str) -> set[int]:
    """Wait until workers 0 and 1 have both answered on ``url``; return the supervisor's worker pids."""
    seen: set[int] = set()

    async def both_answer() -> bool:
        assert supervisor.poll() is None, "the supervisor exited"
        number = await worker_answering(url)
        if number is not None:
            seen.add(number)
        return seen == {0, 1}

    await until_true(both_answer, within=60.0)
    return workers_of(supervisor)


async def test_workers_share_the_port_come_back_after_kill_and_stop_on_sigterm(tmp_path: Path, redis_url: str) -> None:
    """Two workers both answer on one port; kill -9 of one: every later call succeeds and it is restarted;
    idempotency records land in the shared store; SIGTERM to the supervisor ends every worker."""
    prefix = f"gwtest-{uuid.uuid4().hex[:8]}:"
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-c", CLI, "gateway", "--config", str(config), "--port", str(port)]
        command += ["--workers", "2", "--dedup-store", f"{redis_url}?prefix={prefix}"]
        supervisor = subprocess.Popen(command, env={**os.environ, **TOKENS})
        try:
            first = await both_workers_answer(supervisor, url)
            assert len(first) == 2

            key = uuid.uuid4().hex
            answer = await reach(url, "K1", key)
            assert answer.status_code == 200 and answer.json()["data"] == {"order_id": "K1", "by": "o1"}
            store = aioredis.from_url(redis_url)
            try:
                assert [k async for k in store.scan_iter(match=f"{prefix}*")], "no idempotency record in the store"
            finally:
                await store.aclose()

            victim = min(first)
            os.kill(victim, signal.SIGKILL)

            async def gone() -> bool:
                return not alive(victim)

            await until_true(gone, within=10.0)
            for number in range(20):  # the survivor (and the listening socket) carry on meanwhile
                answer = await reach(url, f"after-{number}")
                assert answer.status_code == 200, answer.text
                assert answer.json()["data"] == {"order_id": f"after-{number}", "by": "o1"}

            async def replaced() -> bool:
                workers = workers_of(supervisor)
                return len(workers) == 2 and victim not in workers

            await until_true(replaced, within=30.0)
            last = await both_workers_answer(supervisor, url)
        finally:
            supervisor.send_signal(signal.SIGTERM)
            code = supervisor.wait(30)
    assert code == 0
    assert not any(alive(pid) for pid in last), "a worker outlived its supervisor's SIGTERM"


@pytest.mark.parametrize("store", [[], ["--dedup-store", "memory://"]])
def test_several_workers_need_a_shared_dedup_store(tmp_path: Path, store: list[str]) -> None:
    """--workers 2 without a shared --dedup-store (none, or memory://) exits 2 naming the option: an idempotency
    key retried on another worker would run twice."""
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    command = [sys.executable, "-c", CLI, "gateway", "--config", str(config), "--port", str(free_port())]
    done = subprocess.run(
        [*command, "--workers", "2", *store], capture_output=True, text=True, timeout=30, env={**os.environ, **TOKENS}
    )
    assert done.returncode == 2
    assert "--dedup-store" in done.stdout


def test_workers_must_be_positive(tmp_path: Path) -> None:
    """--workers 0 exits 2 with a message saying it must be at least 1."""
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    command = [sys.executable, "-c", CLI, "gateway", "--config", str(config), "--port", str(free_port())]
    done = subprocess.run(
        [*command, "--workers", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **TOKENS},
    )
    assert done.returncode == 2
    assert "at least 1" in done.stdout


async def test_workers_stop_when_their_supervisor_is_killed(tmp_path: Path, redis_url: str) -> None:
    """kill -9 of the supervisor: its workers notice they are orphans and stop, leaving nobody on the port."""
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-c", CLI, "gateway", "--config", str(config), "--port", str(port)]
    supervisor = subprocess.Popen(
        [*command, "--workers", "2", "--dedup-store", redis_url], env={**os.environ, **TOKENS}
    )
    try:
        workers = await both_workers_answer(supervisor, url)
        supervisor.kill()
        supervisor.wait(10)

        async def all_gone() -> bool:
            return not any(alive(pid) for pid in workers)

        await until_true(all_gone, within=30.0)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    assert await worker_answering(url) is None, "something still answers on the port"


async def test_one_key_through_both_workers_runs_once(tmp_path: Path, redis_url: str) -> None:
    """The same Idempotency-Key sent on a connection to worker 0 and one to worker 1: the agent runs it once."""
    prefix = f"gwtest-{uuid.uuid4().hex[:8]}:"
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-c", CLI, "gateway", "--config", str(config), "--port", str(port)]
        command += ["--workers", "2", "--dedup-store", f"{redis_url}?prefix={prefix}"]
        supervisor = subprocess.Popen(command, env={**os.environ, **TOKENS})
        by_worker: dict[int, httpx.AsyncClient] = {}
        try:
            await both_workers_answer(supervisor, url)

            async def one_connection_to_each() -> bool:
                """Open kept-alive connections until one leads to each worker (a client of one connection each)."""
                http = httpx.AsyncClient(limits=httpx.Limits(max_connections=1))
                number = (await http.get(f"{url}/healthz", timeout=5.0)).json()["worker"]
                if number in by_worker:
                    await http.aclose()
                else:
                    by_worker[number] = http
                return len(by_worker) == 2

            await until_true(one_connection_to_each, within=60.0)
            key, body = uuid.uuid4().hex, {"capability": "query_order", "payload": {"order_id": "ONCE"}}
            answers = [
                await by_worker[number].post(
                    f"{url}/v1/reach", json=body, headers={**AUTH, "Idempotency-Key": key}, timeout=10.0
                )
                for number in (0, 1)
            ]
            for number in (0, 1):  # the same connections still lead to the same workers
                assert (await by_worker[number].get(f"{url}/healthz", timeout=5.0)).json()["worker"] == number
        finally:
            for http in by_worker.values():
                await http.aclose()
            supervisor.send_signal(signal.SIGTERM)
            supervisor.wait(30)
    assert [answer.status_code for answer in answers] == [200, 200]
    assert answers[0].json()["data"] == answers[1].json()["data"] == {"order_id": "ONCE", "by": "o1"}
    assert agents[0].count("query_order") == 1


async def test_workers_started_without_a_key_sign_with_one_key(tmp_path: Path, redis_url: str) -> None:
    """No --issuer-key and no $REACH_ISSUER_KEYS: both workers publish the same one key (each made its own before,
    and refused the other's tokens and exchanges)."""
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-c", CLI, "gateway", "--config", str(config), "--port", str(port)]
        command += ["--workers", "2", "--dedup-store", f"{redis_url}?prefix=gwkey-{uuid.uuid4().hex[:8]}:"]
        env = {name: value for name, value in os.environ.items() if name != "REACH_ISSUER_KEYS"}
        supervisor = subprocess.Popen(command, env={**env, **TOKENS})
        try:
            await both_workers_answer(supervisor, url)
            kids: dict[int, set[str]] = {0: set(), 1: set()}
            async with asyncio.timeout(60):
                while not (kids[0] and kids[1]):  # fresh connections until each worker answered (both did above)
                    async with httpx.AsyncClient() as http:
                        worker = (await http.get(f"{url}/healthz", timeout=5.0)).json()["worker"]
                        jwks = (await http.get(f"{url}/.well-known/jwks.json", timeout=5.0)).json()
                    kids[worker] |= {key["kid"] for key in jwks["keys"]}
        finally:
            supervisor.send_signal(signal.SIGTERM)
            supervisor.wait(timeout=30)
    assert kids[0] == kids[1] and len(kids[0]) == 1, kids
