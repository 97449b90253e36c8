"""The A2A TCK (a2aproject/a2a-tck 1.0-dev @357c4a8, vendored in tests/conformance/a2a-tck), JSON-RPC binding,
whole suite, against the official a2a-sdk 1.3.0 and against our agent SDK, side by side on the same commit.

Both systems under test run the TCK's scenarios (chosen by message-id prefix): the official one is the TCK's
own SUT (``sut/official_sut.py``), ours the same scenarios as a ReachAgent (``a2a_tck_sut.py``). Both runs go
every time, in parallel (about 35 s: the suite waits out its streaming timeouts); the test prints both rows and
fails when ours passes fewer tests, or fewer MUST requirements, than the official SDK.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from peer_servers import _answers, _stop
from servers import _missing, free_port, startup_seconds, wait_until

ROOT = Path(__file__).resolve().parents[1]
TCK = ROOT / "tests" / "conformance" / "a2a-tck"
TCK_PYTHON = ROOT / ".venv-tck" / "bin" / "python"
SUITE_SECONDS = 300


@dataclass(frozen=True)
class Row:
    """One system's TCK result: tests passed / failed / error / skipped, MUST requirements pass / fail / not run."""

    name: str
    passed: int
    failed: int
    errors: int
    skipped: int
    must: tuple[int, int, int]
    failures: tuple[str, ...]

    def __str__(self) -> str:
        tests = f"{self.passed} / {self.failed} / {self.errors} / {self.skipped}"
        return f"{self.name:<22} {tests:<20} {' / '.join(map(str, self.must))}"


@contextlib.contextmanager
def _served(command: list[str], env: dict[str, str], port: int) -> Iterator[str]:
    """Run one SUT until the block ends; yield its base URL once its card answers."""
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=log, stderr=log, env={**os.environ, **env})
        try:
            card = f"{url}/.well-known/agent-card.json"
            wait_until(lambda: process.poll() is not None or _answers(card), startup_seconds(2), "SUT start")
            if process.poll() is not None:
                log.seek(0)
                raise AssertionError(f"{command[-1]} exited: {log.read()[-2000:].decode(errors='replace')}")
            yield url
        finally:
            _stop(process)


def _start(url: str, out: Path) -> subprocess.Popen[bytes]:
    """The TCK's pytest run against ``url`` (JSON-RPC), its reports in ``out``."""
    command = [
        str(TCK_PYTHON),
        "-m",
        "pytest",
        "tests/compatibility/",
        f"--sut-host={url}",
        "--transport=jsonrpc",
        "-q",
        "--tb=line",
        "-p",
        "no:cacheprovider",
        f"--compatibility-report={out / 'compatibility'}",
        f"--junitxml={out / 'junit.xml'}",
    ]
    with (out / "tck.log").open("wb") as log:
        return subprocess.Popen(command, cwd=TCK, stdout=log, stderr=subprocess.STDOUT)


def _row(name: str, out: Path) -> Row:
    suite = ET.parse(out / "junit.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    tests, failed, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    report = json.loads((out / "compatibility.json").read_text())
    levels = collections.Counter(v["status"] for v in report["per_requirement"].values() if v["level"] == "MUST")
    must = (levels["PASS"], levels["FAIL"], levels["NOT TESTED"] + levels["SKIPPED"])
    failures = tuple(sorted(k for k, v in report["per_requirement"].items() if v["status"] == "FAIL"))
    return Row(name, tests - failed - errors - skipped, failed, errors, skipped, must, failures)


def test_the_tck_passes_as_many_tests_on_our_agent_sdk_as_on_the_official_sdk(tmp_path: Path) -> None:
    """TCK 1.0-dev (JSON-RPC, whole suite): ours passes at least the official a2a-sdk's tests and MUST rows."""
    if not TCK_PYTHON.exists():
        _missing("the TCK's virtualenv .venv-tck is missing (scripts/setup.sh builds it)")
    official_port, ours_port = free_port(), free_port()
    official_sut = [str(TCK_PYTHON), str(TCK / "sut" / "official_sut.py")]
    ours_sut = [sys.executable, str(ROOT / "tests" / "conformance" / "a2a_tck_sut.py"), str(ours_port)]
    official_env = {"SUT_HOST": f"127.0.0.1:{official_port}", "GRPC_PORT": str(free_port())}
    with (
        _served(official_sut, official_env, official_port) as official_url,
        _served(ours_sut, {"PYTHONPATH": str(ROOT)}, ours_port) as ours_url,
    ):
        runs = {}
        for name, url in (("official a2a-sdk 1.3.0", official_url), ("reach agent SDK", ours_url)):
            out = tmp_path / name.split()[0]
            out.mkdir()
            runs[name] = (_start(url, out), out)
        for process, _ in runs.values():
            process.wait(SUITE_SECONDS)
    official, ours = (_row(name, out) for name, (_, out) in runs.items())
    print("\nA2A TCK 1.0-dev @357c4a8, JSON-RPC      tests passed/failed/error/skipped   MUST pass/fail/not run")
    for row in (official, ours):
        print(f"{row}    failing: {', '.join(row.failures) or '-'}")
    assert ours.passed >= official.passed, (official, ours)
    assert ours.must[0] >= official.must[0], (official, ours)
