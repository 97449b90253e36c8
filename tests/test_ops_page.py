"""The operations page (issue 28, deliverable 2) on a real `reach gateway` process and 2 agent processes, in Debian's
headless Chromium: live health (a SIGKILLed instance turns unavailable within the probe interval), a click replays a
reach as `reach trace` does, the feeds need the operator token and carry no secret, the screenshot is not blank."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hop_support import AgentProcess, free_port, until_true, write_config
from PIL import Image, ImageStat

from reach_plugins import ReachClient
from reach_plugins.gateway import create_app
from reach_plugins.routing.probes import JITTER, PROBE_TIMEOUT
from reach_plugins.telemetry.trace import JsonLinesSink

CLI = "from reach_plugins.cli import main; main()"
OPERATOR = "tok-operator"
TENANT = "tok-tenant"
SECRET = "key-downstream-secret"
ENV = {"OPS_TOKEN": OPERATOR, "DEMO_TOKEN": TENANT, "DEMO_KEY": SECRET}
PROBE_INTERVAL = 0.5
REFUSALS_TO_DOWN = 2
PROBER_TICK = 0.5
"""The prober's loop wakes this often (routing.probes.Prober's default tick)."""
PAGE_POLL = 1.0
"""The page fetches its feed this often (POLL_MS in ops_page.html)."""
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TENANTS = {
    "demo": {
        "token_env": "DEMO_TOKEN",
        "agents": "*",
        "networks": ["127.0.0.0/8"],
        "credentials": {"orders": {"type": "header", "key": "X-Api-Key", "value_env": "DEMO_KEY"}},
    }
}


@dataclass
class Fleet:
    url: str
    gateway: subprocess.Popen[bytes]
    agents: list[AgentProcess]


def _config(path: Path, urls: list[str], tenants: dict[str, Any] | None = TENANTS) -> Path:
    check = {"probe_interval": f"{int(PROBE_INTERVAL * 1000)}ms", "ready_interval": "30s"}
    check["refusals_to_down"] = REFUSALS_TO_DOWN  # type: ignore[assignment]
    body = {"endpoints": urls, "capabilities": ["query_order"], "health_check": check}
    return write_config(path / "agents.yaml", {"orders": body}, tenants)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    agents = [AgentProcess("orders", label, free_port()) for label in ("a", "b")]
    gateway: subprocess.Popen[bytes] | None = None
    try:
        for agent in agents:
            agent.wait_ready()
        config = _config(tmp_path_factory.mktemp("ops"), [agent.url for agent in agents])
        port = free_port()
        command = [sys.executable, "-c", CLI, "gateway", "--config", str(config), "--port", str(port)]
        gateway = subprocess.Popen(
            [*command, "--metrics-token-env", "OPS_TOKEN"], env={**os.environ, **ENV}, stderr=subprocess.DEVNULL
        )
        url = f"http://127.0.0.1:{port}"
        asyncio.run(until_true(lambda: _ready(url, gateway), within=60.0))
        yield Fleet(url, gateway, agents)
    finally:
        if gateway is not None:
            gateway.send_signal(signal.SIGINT)
            gateway.wait(15)
        for agent in agents:
            agent.kill()


async def _ready(url: str, process: subprocess.Popen[bytes]) -> bool:
    assert process.poll() is None, "the gateway process exited"
    try:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{url}/readyz")).status_code == 200
    except httpx.TransportError:
        return False


def _reach(fleet: Fleet, count: int) -> list[str]:
    """``count`` reaches through the gateway as tenant demo; their request ids."""
    ids = []
    with httpx.Client(headers={"Authorization": f"Bearer {TENANT}"}, timeout=10) as http:
        for n in range(count):
            answer = http.post(
                f"{fleet.url}/v1/reach", json={"capability": "query_order", "payload": {"order_id": f"o{n}"}}
            )
            assert answer.status_code == 200 and answer.json()["status"] == "success", answer.text
            ids.append(answer.json()["request_id"])
    return ids


def _feed(fleet: Fleet, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{fleet.url}/ops/feed", headers=headers, timeout=10)


def _wait(condition: Callable[[], Any], within: float, what: str) -> float:
    """Poll ``condition`` until it is truthy; the seconds it took (an assertion error after ``within``)."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < within, f"{what}: not within {within:.1f}s"
        time.sleep(0.05)
    return time.monotonic() - started


def test_the_feeds_need_the_operator_token_and_show_no_secret(fleet: Fleet) -> None:
    """No token or a tenant's token: 401; the operator's: the fleet, and no token or credential value in it."""
    _reach(fleet, 3)
    assert _feed(fleet, None).status_code == 401
    assert _feed(fleet, TENANT).status_code == 401
    assert httpx.get(f"{fleet.url}/ops/trace?id=x", timeout=10).status_code == 401
    answer = _feed(fleet, OPERATOR)
    assert answer.status_code == 200
    for secret in (OPERATOR, TENANT, SECRET):
        assert secret not in answer.text
    instances = [i for agent in answer.json()["agents"] for i in agent["instances"]]
    assert sorted(i["endpoint"] for i in instances) == sorted(agent.url for agent in fleet.agents)
    assert answer.json()["tenants"][0]["tenant"] == "demo" and answer.json()["tenants"][0]["calls"] >= 3


async def test_without_an_operator_token_the_feed_says_how_to_set_one(tmp_path: Path) -> None:
    """A gateway started without --metrics-token-env refuses the feed and names the option."""
    config = _config(tmp_path, ["http://127.0.0.1:9"])
    app = create_app(config, environ=ENV)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
        answer = await http.get("/ops/feed", headers={"Authorization": f"Bearer {OPERATOR}"})
        page = await http.get("/ops")
    assert answer.status_code == 401 and "--metrics-token-env" in answer.text
    assert page.status_code == 401 and "--metrics-token-env" in page.json()["error"]["message"]


def test_the_page_itself_asks_for_the_token_and_its_cookie_is_not_the_token(fleet: Fleet) -> None:
    """GET /ops without the token: 401 asking a browser for it (Basic); with it as the password: the page and an
    HttpOnly, SameSite=Strict cookie that opens the feed and holds no token; a forged cookie opens nothing."""
    page = httpx.get(f"{fleet.url}/ops", timeout=10)
    assert page.status_code == 401 and page.headers["www-authenticate"].startswith("Basic ")
    assert "operator token" in page.json()["error"]["message"]
    assert httpx.get(f"{fleet.url}/ops", auth=("ops", TENANT), timeout=10).status_code == 401
    signed = httpx.get(f"{fleet.url}/ops", auth=("ops", OPERATOR), timeout=10)
    assert signed.status_code == 200 and "Agents and instances" in signed.text
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and OPERATOR not in cookie
    assert httpx.get(f"{fleet.url}/ops/feed", cookies=signed.cookies, timeout=10).status_code == 200
    forged = {"reach-ops": signed.cookies["reach-ops"][:-1] + ("0" if signed.cookies["reach-ops"][-1] != "0" else "1")}
    assert httpx.get(f"{fleet.url}/ops/feed", cookies=forged, timeout=10).status_code == 401


def _browser() -> Any:
    if not (os.access(CHROMEDRIVER, os.X_OK) and os.access(CHROMIUM, os.X_OK)):
        pytest.skip("Debian's chromium and chromium-driver are not installed (scripts/setup.sh installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--window-size=1280,860",
        "--disable-dev-shm-usage",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def _non_blank(path: Path) -> tuple[float, float]:
    """(share of pixels unlike the most common colour, standard deviation of the grey levels) of a screenshot."""
    image = Image.open(path).convert("RGB")
    colours = image.getcolors(maxcolors=image.width * image.height) or []
    background = max(colours)[0]
    share = 1 - background / (image.width * image.height)
    return share, ImageStat.Stat(image.convert("L")).stddev[0]


def test_a_killed_instance_turns_unavailable_on_the_page(fleet: Fleet, tmp_path: Path) -> None:
    """In Chromium: both instances available, a click replays a reach; SIGKILL one and the page shows it unavailable
    within the probes' bound while the other stays available; the screenshot is not blank."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    ids = _reach(fleet, 6)
    by_url = {i["endpoint"]: i["instance_id"] for a in _feed(fleet, OPERATOR).json()["agents"] for i in a["instances"]}
    victim, survivor = (by_url[agent.url] for agent in fleet.agents)
    driver = _browser()
    try:
        # What the browser's password prompt sends, for the page only; its feeds then go with the cookie alone.
        basic = base64.b64encode(f"ops:{OPERATOR}".encode()).decode()
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {basic}"}})
        driver.get(f"{fleet.url}/ops")
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})

        def state(instance: str) -> str | None:
            """The row's state, read in one script call (the page redraws its rows every second)."""
            found: str | None = driver.execute_script(
                "const row = document.querySelector(arguments[0]); return row ? row.dataset.state : null;",
                f'#instances tr[data-instance="{instance}"]',
            )
            return found

        def clicked(css: str) -> bool:
            """A real click on the element, or False when the page redrew it meanwhile (try again)."""
            try:
                driver.find_element(By.CSS_SELECTOR, css).click()
            except (NoSuchElementException, StaleElementReferenceException):
                return False
            return True

        _wait(lambda: state(victim) == state(survivor) == "available", 15, "both instances shown available")
        kept = driver.execute_script(
            "return document.cookie + JSON.stringify(sessionStorage) + JSON.stringify(localStorage)"
        )
        assert OPERATOR not in kept, "the page's script sees neither the token nor the cookie"
        row = f'#recent tr[data-request="{ids[-1]}"]'
        _wait(lambda: clicked(row), 10, "the last reach listed and clicked")
        replay = driver.find_element(By.ID, "replay")
        _wait(lambda: ids[-1] in replay.text, 10, "the reach replayed")
        assert "route" in replay.text and "attempt" in replay.text, replay.text

        fleet.agents[0].kill()
        bound = REFUSALS_TO_DOWN * PROBE_INTERVAL * (1 + JITTER) + PROBER_TICK + PROBE_TIMEOUT + PAGE_POLL
        took = _wait(lambda: state(victim) == "unavailable", bound, "the killed instance shown unavailable")
        print(f"killed instance unavailable on the page after {took:.2f}s (bound {bound:.2f}s)")
        assert state(survivor) == "available"
        shot = tmp_path / "ops-page.png"
        driver.save_screenshot(str(shot))
    finally:
        driver.quit()
    share, spread = _non_blank(shot)
    print(f"screenshot: {share:.1%} of pixels unlike the background, grey-level stddev {spread:.1f}")
    assert share > 0.05 and spread > 10, (share, spread)
    if os.environ.get("REACH_OPS_SCREENSHOT"):
        shutil.copy(shot, os.environ["REACH_OPS_SCREENSHOT"])


def _ops(*args: str, env: dict[str, str], output: int = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """A `reach ops` process; its output to ``output`` (a pipe only when the test reads it to the end)."""
    command = [sys.executable, "-c", CLI, "ops", *args]
    return subprocess.Popen(command, env={**os.environ, **env}, stdout=output, stderr=subprocess.STDOUT)


def test_reach_ops_refuses_to_start_without_its_operator_token(tmp_path: Path) -> None:
    """`reach ops` with an unset --token-env exits 2 naming the variable (a page nobody could open is refused)."""
    registry = f"file://{_config(tmp_path, ['http://127.0.0.1:9'])}"
    process = _ops(
        "--registry",
        registry,
        "--token-env",
        "NO_SUCH_OPS_TOKEN",
        "--port",
        str(free_port()),
        env={},
        output=subprocess.PIPE,
    )
    said, _ = process.communicate(timeout=60)
    assert process.returncode == 2 and b"NO_SUCH_OPS_TOKEN" in said


async def test_reach_ops_shows_a_direct_fleet_and_its_clients_reaches(tmp_path: Path) -> None:
    """`reach ops --registry`: a direct client's reach (from its trace file) is listed and replayed; a SIGKILLed
    instance turns unavailable within the probes' bound."""
    agent = AgentProcess("orders", "d", free_port())
    process: subprocess.Popen[bytes] | None = None
    try:
        agent.wait_ready()
        registry = f"file://{_config(tmp_path, [agent.url], tenants=None)}"
        traces = tmp_path / "traces.jsonl"
        async with ReachClient(registry, sink=JsonLinesSink(traces)) as client:
            answer = await client.reach("query_order", {"order_id": "o1"})
        assert answer.status == "success"
        port = free_port()
        process = _ops(
            "--registry",
            registry,
            "--token-env",
            "OPS_TOKEN",
            "--port",
            str(port),
            "--trace-file",
            str(traces),
            env=ENV,
        )
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {OPERATOR}"}
        feed: dict[str, Any] = {}

        async def fetched(condition: Callable[[dict[str, Any]], bool]) -> bool:
            assert process is not None and process.poll() is None, "reach ops exited"
            try:
                async with httpx.AsyncClient(timeout=5) as http:
                    got = await http.get(f"{url}/ops/feed", headers=headers)
            except httpx.TransportError:
                return False
            feed.update(got.json() if got.status_code == 200 else {})
            return got.status_code == 200 and condition(feed)

        def instance() -> dict[str, Any]:
            found: dict[str, Any] = feed["agents"][0]["instances"][0]
            return found

        await until_true(lambda: fetched(lambda f: instance()["available"]), within=60.0)
        assert [r["request_id"] for r in feed["recent"]] == [answer.request_id]
        async with httpx.AsyncClient(timeout=5) as http:
            assert (await http.get(f"{url}/ops/feed")).status_code == 401
            replayed = (await http.get(f"{url}/ops/trace", params={"id": answer.request_id}, headers=headers)).json()
        assert answer.request_id in replayed["text"] and "candidate" in replayed["text"]
        agent.kill()
        started = time.monotonic()
        bound = REFUSALS_TO_DOWN * PROBE_INTERVAL * (1 + JITTER) + PROBER_TICK + PROBE_TIMEOUT
        await until_true(lambda: fetched(lambda f: not instance()["available"]), within=bound)
        print(f"reach ops: killed instance unavailable after {time.monotonic() - started:.2f}s (bound {bound:.2f}s)")
        assert instance()["why"].startswith(f"liveness probe failed {REFUSALS_TO_DOWN} time(s) in a row"), instance()
    finally:
        agent.kill()
        if process is not None:
            process.send_signal(signal.SIGINT)
            process.wait(15)
