"""A dependency-free embedder for tool names and descriptions: the default when no model is installed.

Text becomes a hashed bag of features: words (identifiers split, so
``lookupOrderStatus`` and ``lookup_order_status`` both read "lookup order
status"), stemmed lightly (``orders``, ``cancelled``, ``reservation``), mapped
through a small synonym table of the verbs and nouns tools are named with
(lookup/find/get/query/search are one word here), plus character trigrams so
spelling variants still overlap. It knows no meaning beyond that table, so
its threshold is stricter than a sentence model's.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterable, Sequence

DIMENSION = 4096

_IDENTIFIER = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")

_STOPWORDS_TEXT = """
    a an the of for to and or by with in on at from into onto as is are be been was were it its this that these
    those given using use via per each any all some my our your their his her them they we you i me us can could will
    would should may might must do does did has have had if then than so such not no yes up out about over under
    how what when where which who whom why there here one two tool function api returns return call calls"""
STOPWORDS = frozenset(_STOPWORDS_TEXT.split())
"""Words that say nothing about what a tool does."""

SYNONYMS: dict[str, tuple[str, ...]] = {
    "query": ("query", "lookup", "look", "find", "get", "fetch", "retrieve", "search", "check", "view", "show", "read"),
    "create": ("create", "open", "submit", "file", "raise", "new", "add", "make", "register", "generate", "log"),
    "cancel": ("cancel", "abort", "revoke", "void", "withdraw", "rescind"),
    "update": ("update", "modify", "change", "edit", "amend", "patch"),
    "delete": ("delete", "remove", "erase", "purge", "drop"),
    "list": ("list", "enumerate", "browse"),
    "extract": ("extract", "pull", "parse"),
    "summarize": ("summarize", "summarise", "summary", "digest", "tldr", "condense"),
    "refund": ("refund", "reimburse", "reimbursement", "repay"),
    "reserve": ("reserve", "reservation", "hold", "allocate"),
    "validate": ("validate", "verify"),
    "order": ("order", "purchase"),
    "ticket": ("ticket", "case", "incident"),
    "customer": ("customer", "client"),
    "employee": ("employee", "staff", "colleague", "worker"),
    "document": ("document", "doc", "docs", "documentation"),
    "invoice": ("invoice", "bill"),
    "contract": ("contract", "agreement"),
    "coupon": ("coupon", "voucher", "promo"),
    "shipment": ("shipment", "package", "parcel"),
    "leave": ("leave", "vacation", "pto"),
    "product": ("product", "item", "sku"),
}
"""Canonical word -> the words that mean it in tool names. General tool vocabulary, not tuned to one catalogue."""

GENERIC_VERBS = frozenset({"query", "create", "cancel", "update", "delete", "list"})
"""Canonical verbs that say nothing about *what* is acted on: a tool named only ``lookup`` has no object."""


def _stem(word: str) -> str:
    """Strip the common English suffixes so ``orders``/``ordered``/``ordering`` meet at ``order``."""
    for suffix, keep in (("ations", 4), ("ation", 4), ("ings", 4), ("ing", 4), ("ies", 3), ("ied", 3), ("ed", 3)):
        if word.endswith(suffix) and len(word) - len(suffix) >= keep:
            word = word[: -len(suffix)] + ("y" if suffix in ("ies", "ied") else "")
            if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "aeiousl":
                word = word[:-1]
            if len(word) > 4 and word.endswith("ll"):
                word = word[:-1]
            return word
    if word.endswith("es") and len(word) > 4 and word[-3] in "sxzh":
        return word[:-2]
    if word.endswith("s") and len(word) > 3 and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    if word.endswith("e") and len(word) > 4:
        word = word[:-1]
    return word


_CANONICAL: dict[str, str] = {}
for _canonical, _words in SYNONYMS.items():
    for _word in _words:
        _CANONICAL[_word] = _canonical
        _CANONICAL.setdefault(_stem(_word), _canonical)


def words(text: str) -> list[str]:
    """Lowercase words of ``text`` with identifiers split (``getOrderStatus`` -> get, order, status)."""
    return [match.group(0).lower() for match in _IDENTIFIER.finditer(text)]


def terms(text: str) -> list[str]:
    """The canonical terms of ``text``: stop words dropped, stemmed, synonyms folded."""
    out = []
    for word in words(text):
        if word in STOPWORDS:
            continue
        out.append(_CANONICAL.get(word) or _CANONICAL.get(_stem(word)) or _stem(word))
    return out


def has_object(text: str) -> bool:
    """True when ``text`` names something beyond a generic verb (``lookup`` alone does not; ``lookup_order`` does)."""
    return any(term not in GENERIC_VERBS for term in terms(text))


def _bucket(feature: str) -> int:
    return zlib.crc32(feature.encode()) % DIMENSION


class LexicalEmbedder:
    """Hashed bag of canonical words and character trigrams, L2-normalised; no dependency, deterministic."""

    name = "lexical"
    recommended_threshold = 0.38
    """Cosine a tool must reach: no unrelated tool of the tuning set reaches 0.36; 0.38 leaves room for new ones."""

    def __init__(self, *, word_weight: float = 1.0, trigram_weight: float = 0.25) -> None:
        self.word_weight = word_weight
        self.trigram_weight = trigram_weight

    def features(self, text: str) -> dict[int, float]:
        """Sparse vector of ``text``: hashed feature -> weight (sublinear in the count)."""
        counts: dict[int, float] = {}
        for term in terms(text):
            _add(counts, _bucket("w:" + term), self.word_weight)
            grams = _trigrams(term)
            for gram in grams:
                _add(counts, _bucket("c:" + gram), self.trigram_weight / len(grams))
        return {index: 1.0 + math.log(weight) if weight > 1.0 else weight for index, weight in counts.items()}

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector of :data:`DIMENSION` floats per text (all zeros for a text with no words)."""
        return [_dense(self.features(text).items()) for text in texts]


def _trigrams(term: str) -> list[str]:
    padded = f"#{term}#"
    return [padded[i : i + 3] for i in range(len(padded) - 2)]


def _add(counts: dict[int, float], index: int, weight: float) -> None:
    counts[index] = counts.get(index, 0.0) + weight


def _dense(items: Iterable[tuple[int, float]]) -> list[float]:
    vector = [0.0] * DIMENSION
    for index, weight in items:
        vector[index] = weight
    norm = math.sqrt(sum(w * w for w in vector))
    return [w / norm for w in vector] if norm else vector
