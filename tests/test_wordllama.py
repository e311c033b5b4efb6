"""The wordllama embedder: the model inside the wordllama wheel, loaded offline.

It reads two files of the installed package by path (its weights and its
tokenizer) and never imports the package or opens a socket; a text
embeds to the same unit-length row alone or in a batch, and rows are
close to what the package itself computes.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import random
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from field.client import FieldClient
from field.ranking import embedding, relevance
from field.ranking.embedding import (
    WORDLLAMA_DIMS,
    EmbedderError,
    HashingEmbedder,
    WordLlamaEmbedder,
    load_embedder,
    quantize,
)

from .conftest import ServerProcess
from .core_util import Harness

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("wordllama") is None,
    reason="needs the wordllama package: pip install 'akashik-field[wordllama]'",
)

#: (interest, a text close in meaning, an unrelated text): only the first pair shares words
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
#: texts with no letter or digit: no features
EMPTY = ["", "!!!", "   ", "-- ... --", "\n\t"]


@pytest.fixture(scope="module")
def embedders() -> dict[int, WordLlamaEmbedder]:
    return {dim: WordLlamaEmbedder(dim) for dim in WORDLLAMA_DIMS}


def _texts(count: int, seed: int = 7) -> list[str]:
    """Texts of 0 to 40 words, some in other scripts, some with no word at all."""
    words = (
        "the payments API p99 latency doubled after deploy v2.3 rollback office coffee "
        "machine broken Größe naïve 東京 🚀 !!! , -- disk full churn quarter token"
    ).split()
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, 40))) for _ in range(count)]


# -- names and widths -------------------------------------------------------------------


def test_names_and_widths() -> None:
    assert WORDLLAMA_DIMS == (64, 128, 256)
    default = load_embedder("wordllama")
    assert (default.name, default.dim) == ("wordllama-256", 256)
    for dim in WORDLLAMA_DIMS:
        embedder = load_embedder(f"wordllama-{dim}")
        assert (embedder.name, embedder.dim) == (f"wordllama-{dim}", dim)
        assert embedder.embed(["api latency", ""]).shape == (2, dim)
        assert load_embedder(embedder.name).name == embedder.name  # the name loads it again
    for bad in ("wordllama-512", "wordllama-100", "wordllama-0"):
        with pytest.raises(EmbedderError, match=r"one of 64, 128, 256"):
            load_embedder(bad)
    for unknown in ("wordllama-", "wordllama:256", "word-llama"):
        with pytest.raises(EmbedderError, match=r"unknown embedder .*'wordllama'") as info:
            load_embedder(unknown)
        assert "'wordllama-<64|128|256>'" in str(info.value)
        assert "'hashing'" in str(info.value) and "sentence-transformers" in str(info.value)


def test_narrower_widths_are_the_leading_coordinates(
    embedders: dict[int, WordLlamaEmbedder],
) -> None:
    texts = [text for text, _, _ in PAIRS]
    full = embedders[256].embed(texts)
    for dim in (64, 128):
        head = full[:, :dim] / np.linalg.norm(full[:, :dim], axis=1, keepdims=True)
        assert np.allclose(embedders[dim].embed(texts), head, atol=1e-6)


# -- rows -----------------------------------------------------------------------------


def test_rows_are_unit_length_float32(embedders: dict[int, WordLlamaEmbedder]) -> None:
    texts = [t for t in _texts(200) if any(c.isalnum() for c in t)]
    for dim, embedder in embedders.items():
        rows = embedder.embed(texts)
        assert rows.dtype == np.float32 and rows.shape == (len(texts), dim)
        assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-6)


def test_a_text_with_no_letter_or_digit_is_a_zero_row(
    embedders: dict[int, WordLlamaEmbedder],
) -> None:
    for embedder in embedders.values():
        rows = embedder.embed([*EMPTY, "api latency"])
        assert not rows[: len(EMPTY)].any()
        assert rows[-1].any()
        quantized, squares = quantize(rows)
        assert not quantized[: len(EMPTY)].any() and not squares[: len(EMPTY)].any()
        assert embedder.embed([]).shape == (0, embedder.dim)


def test_rows_are_deterministic_across_loads() -> None:
    texts = _texts(50, seed=3)
    assert np.array_equal(WordLlamaEmbedder().embed(texts), WordLlamaEmbedder().embed(texts))


def test_a_text_embeds_the_same_alone_or_in_a_batch(
    embedders: dict[int, WordLlamaEmbedder],
) -> None:
    texts = _texts(300)
    assert any(not any(c.isalnum() for c in t) for t in texts)  # zero rows among the others
    texts[150] = " ".join(texts[:150])  # longer than the token rows gathered at once
    assert len(embedders[64]._tokenizer.encode(texts[150]).ids) > embedding._GATHERED
    for embedder in embedders.values():
        batch = embedder.embed(texts)
        alone = np.concatenate([embedder.embed([text]) for text in texts])
        assert np.array_equal(batch, alone)  # bit for bit
        assert np.array_equal(embedder.embed(texts[::-1]), batch[::-1])


def test_a_texts_token_rows_are_summed_in_order(embedders: dict[int, WordLlamaEmbedder]) -> None:
    """Each text's row is its tokens' rows added first to last, whatever the batch holds:
    texts of one token, many of one length, and texts longer than a gather."""
    rng = random.Random(5)
    vocabulary = len(embedders[64]._table) - 1
    lengths = [1, 1, 2, 3, 7, 7, 7, 40, 57, 64, 65, 300, embedding._GATHERED + 5]
    lengths += [rng.randint(1, 120) for _ in range(200)]
    rng.shuffle(lengths)
    ids = [[rng.randrange(vocabulary) for _ in range(n)] for n in lengths]
    for embedder in embedders.values():
        table = embedder._table
        expected = []
        for text in ids:
            total = table[text[0]].copy()
            for token in text[1:]:
                total = total + table[token]
            expected.append(total)
        got = embedder._sums(ids)
        assert np.array_equal(got.view(np.uint32), np.array(expected).view(np.uint32))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(
            st.sampled_from(
                list(" aAbé東🚀\n\t!0\u2581-") + ["latency", " pricing", "  ", "churn"]
            ),
            max_size=30,
        ).map("".join),
        min_size=1,
        max_size=12,
    )
)
def test_a_texts_ids_are_its_words_ids_one_after_the_other(texts: list[str]) -> None:
    """The ids made from the words' kept ids are the tokenizer's for the whole text:
    spaces in runs, at either end, a ``▁`` of the text's own, other scripts."""
    embedder = _EMBEDDER()
    encode = embedder._tokenizer.encode
    expected = [encode(text, add_special_tokens=False).ids for text in texts]
    assert embedder._token_ids(texts) == expected
    assert embedder._token_ids(texts[::-1]) == expected[::-1]  # now from what was kept


@functools.cache
def _EMBEDDER() -> WordLlamaEmbedder:
    return WordLlamaEmbedder(64)


def test_kept_word_ids_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    embedder = WordLlamaEmbedder(64)
    monkeypatch.setattr(embedding, "KEPT_PIECES", 50)
    texts = _texts(200, seed=9) + [f"word{i} x{i}" for i in range(100)]
    first = embedder.embed(texts)
    assert len(embedder._pieces) == 50
    assert all(len(piece) <= embedding._KEPT_PIECE_CHARS for piece in embedder._pieces)
    assert np.array_equal(embedder.embed(texts), first)
    assert np.array_equal(WordLlamaEmbedder(64).embed(texts), first)


def test_rows_match_the_packages_own_inference(embedders: dict[int, WordLlamaEmbedder]) -> None:
    """The package's WordLlamaInference (mean of token rows, normalized) agrees to 1e-6.

    It runs in another process: importing the package configures the root logger.
    """
    texts = [t for t in _texts(100, seed=11) if any(c.isalnum() for c in t)]
    script = (
        "import importlib.util, json, pathlib, sys\n"
        "from safetensors.numpy import load_file\n"
        "from tokenizers import Tokenizer\n"
        "from wordllama import WordLlamaInference\n"
        "root = pathlib.Path(importlib.util.find_spec('wordllama').origin).parent\n"
        "table = load_file(root / 'weights' / 'l2_supercat_256.safetensors')['embedding.weight']\n"
        "tokenizer = Tokenizer.from_file(str(root / 'tokenizers' / "
        "'l2_supercat_tokenizer_config.json'))\n"
        "texts, dim = json.loads(sys.stdin.read())\n"
        "model = WordLlamaInference(table[:, :dim], tokenizer)\n"
        "sys.stdout.write(model.embed(texts, norm=True).tobytes().hex())\n"
    )
    for dim, embedder in embedders.items():
        result = subprocess.run(
            [sys.executable, "-c", script],
            input=json.dumps([texts, dim]),
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        theirs = np.frombuffer(bytes.fromhex(result.stdout), dtype=np.float32)
        ours = embedder.embed(texts)
        assert np.allclose(ours, theirs.reshape(ours.shape), rtol=0, atol=1e-6)


def test_related_texts_are_closer_than_unrelated_ones(
    embedders: dict[int, WordLlamaEmbedder],
) -> None:
    for embedder in embedders.values():
        for interest, close, unrelated in PAIRS:
            rows = embedder.embed([interest, close, unrelated])
            near, far = float(rows[0] @ rows[1]), float(rows[0] @ rows[2])
            assert near > far + 0.2, (embedder.name, interest, near, far)
    # the pairs that share no word are beyond the hashing embedder
    hashing = HashingEmbedder()
    beaten = 0
    for interest, close, unrelated in PAIRS[1:]:
        rows = hashing.embed([interest, close, unrelated])
        beaten += float(rows[0] @ rows[1]) < float(rows[0] @ rows[2]) + 0.2
    assert beaten == len(PAIRS) - 1


# -- offline --------------------------------------------------------------------------


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
    monkeypatch.setenv("HOME", str(tmp_path))  # the package's own loader caches under ~/.cache
    monkeypatch.delitem(sys.modules, "wordllama", raising=False)
    with pytest.raises(OSError):  # the patch works
        socket.create_connection(("127.0.0.1", 9))
    attempts.clear()
    for dim in WORDLLAMA_DIMS:
        embedder = load_embedder(f"wordllama-{dim}")
        rows = embedder.embed([close for _, close, _ in PAIRS])
        assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-6)
    assert attempts == []
    assert "wordllama" not in sys.modules  # the package's loader (which can download) not run
    assert list(tmp_path.iterdir()) == []


def test_a_missing_package_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    embedding._wordllama.cache_clear()  # one model per process: load it again
    for module in ("wordllama", "tokenizers", "safetensors"):
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, module, None)
            with pytest.raises(EmbedderError) as info:
                load_embedder("wordllama")
        message = str(info.value)
        assert "needs the wordllama package" in message
        assert "pip install 'akashik-field[wordllama]'" in message


def test_missing_model_files_are_an_error_not_a_download(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedding, "_WORDLLAMA_WEIGHTS", ("weights", "absent.safetensors"))
    with pytest.raises(EmbedderError, match=r"cannot load the wordllama model .*nothing is"):
        WordLlamaEmbedder()


# -- in the Field ---------------------------------------------------------------------


def _unit(number: int, content: str) -> dict[str, Any]:
    return {
        "id": f"u{number}",
        "type": "finding",
        "content": content,
        "intent": {},
        "source": {"agent_id": "a", "agent_role": "r"},
        "status": "active",
        "epoch": number,
    }


def test_a_unit_index_scores_with_it(embedders: dict[int, WordLlamaEmbedder]) -> None:
    embedder = embedders[256]
    index = relevance.UnitIndex(embedder=embedder)
    contents = [text for _, close, unrelated in PAIRS for text in (close, unrelated)] + ["!!!"]
    for number, content in enumerate(contents, 1):
        index.add(_unit(number, content))
    vectors = index.vectors
    assert vectors.shape == (len(contents), 256) and vectors.dtype == np.float32
    assert np.array_equal(vectors, np.rint(vectors)) and np.abs(vectors).max() == 127
    assert index.squares[-1] == 0.0 and not vectors[-1].any()
    expected, _ = quantize(embedder.embed(contents))
    assert np.array_equal(vectors, expected)
    for pair, (interest, _, _) in enumerate(PAIRS):
        vector, square = index.embed(interest)
        scores = index.similarity(vector, square)
        assert scores[2 * pair] > scores[2 * pair + 1] + 0.2


def test_a_field_reports_and_ranks_with_it(embedders: dict[int, WordLlamaEmbedder]) -> None:
    h = Harness(embedder=embedders[128])
    registered = h.register("reader", "analyst", interests=["database disk almost full"])
    assert registered["field_capabilities"]["embedder"] == "wordllama-128"
    h.register("w", "engineer")
    for _, close, unrelated in PAIRS:
        h.record("w", unrelated)
        h.record("w", close)
    ranked = [item["memory_unit"]["content"] for item in h.attune("reader")["record"]]
    assert ranked[0] == PAIRS[1][1]


# -- the command line -----------------------------------------------------------------


@pytest.mark.slow
async def test_serve_accepts_the_wordllama_embedder(
    server_process: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    proc = server_process(tmp_path / "unused", "--in-memory", "--embedder", "wordllama-64")
    async with FieldClient(proc.url) as field:
        agent = await field.register("agent-1", "tester")
        assert agent.registration["field_capabilities"]["embedder"] == "wordllama-64"


@pytest.mark.parametrize("spec", ["wordllama-512", "wordllama-"])
def test_serve_refuses_a_width_the_model_lacks_in_one_line(spec: str) -> None:
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
    assert "wordllama" in lines[0] and "embedder" in lines[0]


@pytest.mark.slow
async def test_a_log_written_with_hashing_opens_with_the_default_embedder(
    server_process: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A Field's log does not depend on its embedder: one written with ``--embedder hashing``
    (the default before wordllama) opens with the default, every unit embedded again, and
    a paraphrase that shares no word with an interest is then found by its meaning."""
    data = tmp_path / "field"
    units = {
        "close": "The German payroll software space is worth 1.2 billion euros a year.",
        "far": "The office coffee machine is broken again.",
    }
    first = server_process(data, "--embedder", "hashing")
    async with FieldClient(first.url) as field:
        writer = await field.register("writer", "analyst")
        reader = await field.register("reader", "strategist", interests=["market size"])
        assert reader.registration["field_capabilities"]["embedder"] == "hashing-128"
        ids = {
            name: (
                await writer.record(
                    "finding", text, purpose="keep the team informed", confidence=0.8, reasoning="r"
                )
            )["memory_unit_id"]
            for name, text in units.items()
        }
    assert first.stop() == 0
    second = server_process(data)  # the default embedder
    async with FieldClient(second.url) as field:
        reader = await field.register("reader-2", "strategist", interests=["market size"])
        assert reader.registration["field_capabilities"]["embedder"] == "wordllama-256"
        assert reader.registration["field_capabilities"]["relevance"]["weights"] == "sentence"
        page = (await reader.attune())["record"]
    by_id = {item["memory_unit"]["id"]: item for item in page}
    assert set(by_id) == set(ids.values())  # nothing lost
    close, far = by_id[ids["close"]], by_id[ids["far"]]
    assert close["relevance_score"] > far["relevance_score"]  # by meaning: no word is shared
