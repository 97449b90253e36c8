"""Map a framework's tool to the capability that serves it: exact name first, then meaning, never a guess.

Rules, in order:

1. capabilities lacking any of the call's ``scope_tags`` are dropped before
   anything is scored (tags are hard constraints: they stop two similar
   descriptions from pulling a tool into the wrong domain);
2. a capability named exactly like the tool wins (``queryOrder`` and
   ``query-order`` count as ``query_order``);
3. a tool whose name and description hold nothing but generic verbs
   (``lookup``, ``create``) says nothing about what it acts on: no route;
4. otherwise the tool's name (split into words) and description are embedded
   and compared by cosine with each capability's name and description; the
   best one is chosen only if it reaches the threshold and beats the runner-up
   by more than ``margin`` — a near tie routes nowhere and logs a warning
   naming both, because a silent wrong route is worse than the local tool.

Thresholds are per embedder (``recommended_threshold``; scores of different
models are not comparable) and were measured on :mod:`.evalset`.

Decisions are cached per (tool name, description, scope tags), and every one
carries its score, the runner-up and the reason, so users can ask why.

Matching never stalls routing (seed 001, section 2.3): on the routing path
the model gets ``timeout`` seconds (:data:`DEFAULT_TIMEOUT`, 50 ms) per text it must embed; when it is
slower or fails, the decision falls back to rules 1-3 (exact name and scope
tags) with reason ``degraded``, is not cached, and the model is asked again
next time.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Literal

from reach_plugins.errors import ConfigError
from reach_plugins.matching.embedders import Embedder, EmbedFunction, as_embedder, default_embedder
from reach_plugins.matching.lexical import has_object, words
from reach_plugins.model import Capability

logger = logging.getLogger("reach_plugins.matching")

Reason = Literal["exact", "semantic", "ambiguous", "below_threshold", "filtered", "degraded"]

DEFAULT_MARGIN = 0.05
DEFAULT_TIMEOUT = 0.05
"""Seconds the model may take per tool text on the routing path before matching falls back to names and tags."""
WARMUP_TIMEOUT = 10.0
"""Seconds the model may take to load and embed catalogue entries it has not seen (a one-time cost per change)."""
CACHE_SIZE = 4096

_Key = tuple[str, str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class MatchResult:
    """The decision for one tool: the capability (or ``None``), the two closest candidates, and why.

    ``best``/``score`` is the top-ranked candidate whether or not it was chosen,
    ``runner_up``/``runner_up_score`` the second; with ``reason`` they answer
    "why did this tool route there (or nowhere)?".
    """

    capability: str | None
    score: float
    runner_up: str | None
    runner_up_score: float | None
    reason: Reason
    best: str | None = None
    contenders: tuple[tuple[str, float], ...] = ()
    """When ``ambiguous``: every capability above the threshold within ``margin`` of the best, with its
    similarity, best first (what :mod:`.ranking` weighs against free capacity)."""

    def __str__(self) -> str:
        if self.reason == "degraded":
            return f"nothing: degraded ({self.best}; fell back to exact name and scope-tag match)"
        head = self.capability or "nothing"
        best = f" (best {self.best} {self.score:.3f})" if self.best else ""
        other = f", runner-up {self.runner_up} {self.runner_up_score:.3f}" if self.runner_up else ""
        return f"{head}: {self.reason}{best}{other}"


def identifier(name: str) -> str:
    """The snake_case form of a tool or capability name (``getOrder``, ``get-order`` -> ``get_order``)."""
    return "_".join(words(name))


def capability_text(capability: Capability) -> str:
    """What a capability is compared on: its name as words, then its description."""
    return _text(capability.name, capability.description)


def _text(name: str, description: str) -> str:
    label = " ".join(words(name))
    return f"{label}. {description.strip()}" if description.strip() else label


class CapabilityMatcher:
    """Chooses the capability a tool call should reach, or ``None`` when no choice is safe."""

    def __init__(
        self,
        capabilities: Iterable[Capability],
        *,
        embedder: Embedder | EmbedFunction | None = None,
        threshold: float | None = None,
        margin: float = DEFAULT_MARGIN,
        timeout: float | None = None,
    ) -> None:
        self.embedder = default_embedder() if embedder is None else as_embedder(embedder)
        self.threshold = _threshold(self.embedder, threshold)
        if not 0.0 <= margin < 1.0:
            raise ConfigError(f"margin must be in [0, 1) (a cosine difference), got {margin}")
        if timeout is not None and timeout <= 0:
            raise ConfigError(f"timeout must be a positive number of seconds (or None: wait), got {timeout}")
        self.margin = margin
        self.timeout = timeout
        """Seconds the model may take per text to embed; ``None`` (the default here, for evaluation and
        offline use) waits as long as it takes. The routing path (the enhancer's tool mapping) uses
        :data:`DEFAULT_TIMEOUT`."""
        self._worker: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._vectors: dict[str, list[float]] = {}
        self._decisions: OrderedDict[_Key, MatchResult] = OrderedDict()
        self._capabilities: dict[str, Capability] = {}
        self._generation = 0
        self.update(capabilities)

    @property
    def embedder_name(self) -> str:
        return self.embedder.name

    @property
    def capabilities(self) -> tuple[str, ...]:
        """Names of the capabilities this matcher chooses among."""
        return tuple(self._capabilities)

    def describe(self) -> str:
        """One line saying which embedder and thresholds decide (for logs and ``reach`` output)."""
        return (
            f"capability matcher: embedder {self.embedder.name}, threshold {self.threshold:.2f}, "
            f"margin {self.margin:.2f}, {len(self._capabilities)} capabilities"
        )

    def update(self, capabilities: Iterable[Capability]) -> None:
        """Replace the catalogue (e.g. after a registry change); vectors of unchanged texts are reused."""
        catalogue: dict[str, Capability] = {}
        for capability in capabilities:
            catalogue.setdefault(capability.name, capability)
        with self._lock:
            self._capabilities = catalogue
            self._generation += 1
            self._decisions.clear()
            wanted = {capability_text(c) for c in catalogue.values()}
            self._vectors = {text: vector for text, vector in self._vectors.items() if text in wanted}

    def match(
        self, tool_name: str, description: str = "", *, scope_tags: Sequence[str] = (), wait: bool = False
    ) -> MatchResult:
        """The capability ``tool_name`` maps to; cached, so asking again is a dict lookup.

        ``wait=True`` ignores :attr:`timeout` (explanations and build-time matching are not the routing path).
        """
        return self.match_many([(tool_name, description)], scope_tags=scope_tags, wait=wait)[0]

    def match_many(
        self, tools: Iterable[tuple[str, str]], *, scope_tags: Sequence[str] = (), wait: bool = False
    ) -> list[MatchResult]:
        """Decide for several ``(tool name, description)`` pairs at once: one embedding batch for all new ones.

        An agent's tools are known when it is built; matching them together
        costs one model call instead of one per tool.
        """
        pairs = list(tools)
        for name, _ in pairs:
            if not name.strip():
                raise ConfigError("tool name must be non-empty, e.g. 'get_order_status'")
        tags = tuple(sorted(scope_tags))
        keys = [(name, description, tags) for name, description in pairs]
        with self._lock:
            generation = self._generation
            found = {key: self._decisions[key] for key in keys if key in self._decisions}
        candidates = self._eligible(tags)
        fresh = {key: self._decide_without_model(key[0], key[1], candidates) for key in keys if key not in found}
        semantic = sorted({key for key, result in fresh.items() if result is None})
        timeout = None if wait else self.timeout
        judged = self._judge_all(semantic, candidates, generation, timeout) if semantic else {}
        decided = {key: result for key, result in fresh.items() if result is not None} | judged
        with self._lock:
            if generation == self._generation:
                self._decisions.update((key, result) for key, result in decided.items() if result.reason != "degraded")
                for key in found:
                    self._decisions.move_to_end(key)
                while len(self._decisions) > CACHE_SIZE:
                    self._decisions.popitem(last=False)
        found.update(decided)
        return [found[key] for key in keys]

    def _judge_all(
        self, semantic: list[_Key], candidates: Sequence[Capability], generation: int, timeout: float | None
    ) -> dict[_Key, MatchResult]:
        """Score ``semantic`` tools with the model within the time budget, or decide them ``degraded``.

        The budget is ``timeout`` per tool text, plus :data:`WARMUP_TIMEOUT` when catalogue
        entries are not embedded yet (loading a model and indexing a new catalogue is a one-time
        cost, not a per-call one). A model that overruns it keeps working in the background and its
        decisions are cached when they arrive, so the next call finds them; a ``ConfigError`` (a
        broken embedder) is raised.
        """

        def judge() -> dict[_Key, MatchResult]:
            vectors = self._embed([_text(name, description) for name, description, _ in semantic])
            return {
                key: self._judge(key[0], self._scores(vector, candidates))
                for key, vector in zip(semantic, vectors, strict=True)
            }

        if timeout is None:
            return judge()
        with self._lock:
            unembedded = len({capability_text(c) for c in candidates} - set(self._vectors))
            if self._worker is None:
                self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reach-matcher")
            worker = self._worker
        budget = timeout * len(semantic) + (WARMUP_TIMEOUT if unembedded else 0.0)
        future = worker.submit(judge)
        try:
            return future.result(timeout=budget)
        except FutureTimeout:
            if not future.cancel():
                future.add_done_callback(lambda done: self._adopt(done, generation))
            why = f"the embedder {self.embedder.name} took longer than {budget * 1000:g} ms"
        except ConfigError:
            raise
        except Exception as exc:
            why = f"the embedder {self.embedder.name} failed ({type(exc).__name__})"
        logger.warning("semantic matching degraded: %s; routing by exact name and scope tags only", why)
        return {key: MatchResult(None, 0.0, None, None, "degraded", best=why) for key in semantic}

    def _adopt(self, done: Future[dict[_Key, MatchResult]], generation: int) -> None:
        """Cache the decisions of a model run that finished after its caller stopped waiting."""
        if done.cancelled() or done.exception() is not None:
            return
        with self._lock:
            if generation == self._generation:
                self._decisions.update(done.result())

    def rank(self, tool_name: str, description: str = "", *, scope_tags: Sequence[str] = ()) -> list[tuple[str, float]]:
        """Every eligible capability with its cosine score, best first (uncached; for explanations and tuning)."""
        candidates = self._eligible(tuple(scope_tags))
        if not candidates:
            return []
        return self._scores(self._embed([_text(tool_name, description)])[0], candidates)

    def _decide_without_model(
        self, tool_name: str, description: str, candidates: Sequence[Capability]
    ) -> MatchResult | None:
        """The decisions that need no embedding: nothing eligible, an exact name, a tool naming no object."""
        if not candidates:
            return MatchResult(None, 0.0, None, None, "filtered")
        name = identifier(tool_name)
        for capability in candidates:
            if identifier(capability.name) == name:
                return MatchResult(capability.name, 1.0, None, None, "exact", best=capability.name)
        if not has_object(_text(tool_name, description)):
            return MatchResult(None, 0.0, None, None, "below_threshold")
        return None

    def _judge(self, tool_name: str, ranked: list[tuple[str, float]]) -> MatchResult:
        best, score = ranked[0]
        runner_up, runner_score = ranked[1] if len(ranked) > 1 else (None, None)
        if score < self.threshold:
            return MatchResult(None, score, runner_up, runner_score, "below_threshold", best=best)
        if runner_score is not None and score - runner_score <= self.margin:
            logger.warning(
                "tool %r is ambiguous between capabilities %r (%.3f) and %r (%.3f) with %s; "
                "meaning alone routes it nowhere (free capacity may break the tie): add it to capability_map or "
                "give it a more specific description",
                tool_name,
                best,
                score,
                runner_up,
                runner_score,
                self.embedder.name,
            )
            close = tuple(
                (name, similarity)
                for name, similarity in ranked
                if score - similarity <= self.margin and similarity >= self.threshold
            )
            return MatchResult(None, score, runner_up, runner_score, "ambiguous", best=best, contenders=close)
        return MatchResult(best, score, runner_up, runner_score, "semantic", best=best)

    def _scores(self, query: list[float], candidates: Sequence[Capability]) -> list[tuple[str, float]]:
        """Cosine of ``query`` with each candidate, best first (ties by name, so the order is stable)."""
        nonzero = [(i, v) for i, v in enumerate(query) if v]
        scores = []
        for capability in candidates:
            vector = self._capability_vector(capability)
            if len(vector) != len(query):
                raise ConfigError(
                    f"embedder {self.embedder.name!r} returned vectors of {len(query)} and {len(vector)} "
                    "dimensions; every vector of one embedder must have the same length"
                )
            scores.append((capability.name, sum(v * vector[i] for i, v in nonzero)))
        return sorted(scores, key=lambda pair: (-pair[1], pair[0]))

    def _eligible(self, scope_tags: tuple[str, ...]) -> list[Capability]:
        with self._lock:
            catalogue = list(self._capabilities.values())
        return [c for c in catalogue if all(tag in c.scope_tags for tag in scope_tags)]

    def _capability_vector(self, capability: Capability) -> list[float]:
        text = capability_text(capability)
        vector = self._vectors.get(text)
        if vector is None:
            self._embed_catalogue()
            vector = self._vectors.get(text) or self._embed([text])[0]  # gone if update() raced this match
        return vector

    def _embed_catalogue(self) -> None:
        """Embed every capability text not embedded yet, in one batch."""
        with self._lock:
            missing = sorted({capability_text(c) for c in self._capabilities.values()} - set(self._vectors))
        if not missing:
            return
        vectors = self._embed(missing)
        with self._lock:
            self._vectors.update(zip(missing, vectors, strict=True))

    def _embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Vectors of ``texts`` scaled to unit length, so a dot product is the cosine."""
        vectors = self.embedder.embed(texts)
        if len(vectors) != len(texts):
            raise ConfigError(
                f"embedder {self.embedder.name!r} returned {len(vectors)} vectors for {len(texts)} texts; "
                "it must return exactly one vector per text"
            )
        return [_unit(vector) for vector in vectors]


def _unit(vector: Sequence[float]) -> list[float]:
    values = [float(x) for x in vector]
    norm = math.sqrt(sum(x * x for x in values))
    return [x / norm for x in values] if norm else values


def _threshold(embedder: Embedder, threshold: float | None) -> float:
    if threshold is None:
        recommended = getattr(embedder, "recommended_threshold", None)
        if not isinstance(recommended, int | float):
            raise ConfigError(
                f"embedder {embedder.name!r} has no recommended_threshold: pass threshold= (the cosine, "
                "between -1 and 1, a tool must reach to be mapped; measure it on your own tools)"
            )
        threshold = float(recommended)
    if not -1.0 <= threshold <= 1.0:
        raise ConfigError(f"threshold is a cosine similarity and must be in [-1, 1], got {threshold}")
    return threshold
