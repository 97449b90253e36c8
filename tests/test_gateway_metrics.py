"""A server's counters add up in the process and reach /metrics at each scrape, exactly, from any thread."""

from __future__ import annotations

import re
import threading
import urllib.request

from reach_plugins.telemetry.prometheus import Metrics


def _value(text: str, series: str) -> float:
    """The sample of ``series`` (name and labels as the exporter writes them) in a Prometheus text page."""
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    assert found, f"{series} is not in the page"
    return float(found.group(1))


def test_counters_show_every_add_at_each_scrape_from_many_threads() -> None:
    """8 threads x 2,000 adds on two label sets read back exactly, across two scrapes (nothing lost, nothing twice)."""
    metrics = Metrics()
    metrics.declare("jobs_total", "counter", "Jobs.")
    barrier = threading.Barrier(8)

    def work(kind: str) -> None:
        barrier.wait()
        for _ in range(2000):
            metrics.inc("jobs_total", {"kind": kind})

    threads = [threading.Thread(target=work, args=("a" if n % 2 else "b",)) for n in range(8)]
    for thread in threads:
        thread.start()
    first = metrics.render()  # a scrape while the threads add
    for thread in threads:
        thread.join()
    assert _value(first, 'jobs_total{kind="a"}') <= 8000
    last = metrics.render()
    assert _value(last, 'jobs_total{kind="a"}') == _value(last, 'jobs_total{kind="b"}') == 8000
    metrics.inc("jobs_total", {"kind": "a"}, 2.5)
    assert _value(metrics.render(), 'jobs_total{kind="a"}') == 8002.5


def test_a_counter_with_a_list_valued_label_is_still_counted() -> None:
    """An unhashable attribute value (a sequence) is measured as it comes instead of being lost."""
    metrics = Metrics()
    metrics.declare("hops_total", "counter", "Hops.")
    metrics.inc("hops_total", {"path": ["a", "b"]})  # type: ignore[dict-item]
    metrics.inc("hops_total", {"path": ["a", "b"]})  # type: ignore[dict-item]
    assert re.search(r"^hops_total\{path=\"\[.*\]\"\} 2\.0$", metrics.render(), re.MULTILINE)


def test_the_metrics_thread_server_scrapes_flush_too() -> None:
    """The node's /metrics (a prometheus_client thread server) shows counters added since its last scrape."""
    metrics = Metrics()
    metrics.declare("calls_total", "counter", "Calls.")
    server = metrics.serve_http("127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        total = 0
        for adds in (3, 4):
            for _ in range(adds):
                metrics.inc("calls_total", {"kind": "x"})
            total += adds
            with urllib.request.urlopen(url, timeout=5) as answer:
                assert _value(answer.read().decode(), 'calls_total{kind="x"}') == total
    finally:
        server.shutdown()
        metrics.shutdown()
