"""Semantic relevance (spec Level 2): embeddings in ATTUNE and in subscription matching."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import types
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from field.client import FieldClient
from field.core.attune import tokens
from field.core.field import Field
from field.ranking import embedding, relevance
from field.ranking.calibration import FEW_ROWS, Calibration
from field.ranking.embedding import (
    EmbedderError,
    HashingEmbedder,
    Vectors,
    load_embedder,
    quantize,
)
from field.ranking.relevance import LEXICAL
from field.server.config import Config
from field.subscriptions.registry import KEPT_SCALES

from .conftest import ThreadedServer
from .core_util import Harness
from .reference_relevance import reference_scores
from .schema_util import assert_valid
from .test_matcher import (
    check_against_reference,
    check_splits,
    events_of,
    matcher_of,
    notified,
    subscribe,
)
from .test_push import open_ws, record

INTERESTS = ["pricing strategy"]
#: shares no keyword with INTERESTS, but word pieces ("pric", "strateg")
CLOSE = "a strategic repricing of plans"
UNRELATED = "hired two engineers for the backend team"


def test_the_close_text_matches_no_keyword() -> None:
    interest_words = {w for phrase in INTERESTS for w in relevance.keywords(phrase)}
    assert not interest_words & set(relevance.keywords(CLOSE))
    assert not interest_words & set(relevance.keywords(UNRELATED))


# -- ATTUNE ----------------------------------------------------------------------


def _two_units(h: Harness) -> tuple[str, str]:
    """The close unit first (older, so recency works against it), by two equal agents."""
    h.register("reader", "analyst", interests=INTERESTS)
    h.register("w1", "engineer")
    h.register("w2", "engineer")
    close = h.record("w1", CLOSE, score=0.5)["memory_unit_id"]
    unrelated = h.record("w2", UNRELATED, score=0.5)["memory_unit_id"]
    return close, unrelated


@pytest.mark.parametrize("by", ["interests", "context_hint"])
def test_a_paraphrase_outranks_an_unrelated_unit_with_equal_other_features(by: str) -> None:
    h = Harness()
    close, unrelated = _two_units(h)
    if by == "interests":
        response = h.attune("reader")
    else:
        response = h.attune("reader", interests=[], context_hint="pricing strategy")
    ranked = [item["memory_unit"]["id"] for item in response["record"]]
    assert ranked == [close, unrelated]
    first, second = response["record"]
    assert first["relevance_score"] > second["relevance_score"]
    about = 'interest "pricing strategy"' if by == "interests" else "context hint"
    assert f"close in meaning to your {about} (closer than" in first["relevance_reason"]
    assert "close in meaning" not in second["relevance_reason"]
    assert "matches your" not in first["relevance_reason"]  # no keyword matched


def test_without_interests_or_hint_the_semantic_factor_drops_out() -> None:
    h = Harness()
    h.register("reader", "analyst")
    h.register("w1", "engineer")
    h.register("w2", "engineer")
    h.record("w1", CLOSE, score=0.5)
    h.record("w2", UNRELATED, score=0.5)
    response = h.attune("reader", recency_weight=0.0)
    scores = [item["relevance_score"] for item in response["record"]]
    assert scores[0] == scores[1]  # nothing tells the two apart
    assert all("close in meaning" not in item["relevance_reason"] for item in response["record"])


TEXT = st.lists(
    st.one_of(
        st.sampled_from(["pricing", "strategy", "churn", "the", "of", "Größe", "-", "!!", "_"]),
        st.text(alphabet="prcingstÉ_-. ", max_size=8),
    ),
    max_size=6,
).map(" ".join)


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.tuples(TEXT, st.sampled_from(["a1", "a2", "a3"])), max_size=25),
    st.lists(TEXT, max_size=3),
    st.one_of(st.none(), TEXT),
    st.floats(min_value=0, max_value=1),
)
def test_vectorized_scores_match_the_reference_on_free_text(
    units: list[tuple[str, str]], interests: list[str], hint: str | None, recency_weight: float
) -> None:
    """Any text, including texts that embed to nothing (no word characters, stop words)."""
    index = relevance.UnitIndex()
    stored = []
    for i, (content, agent) in enumerate(units):
        unit = {
            "id": f"mem-{i}",
            "type": "finding",
            "content": content or "-",
            "intent": {"purpose": "p", "task_id": None, "question": None},
            "source": {"agent_id": agent, "agent_role": "r"},
            "status": "active",
            "epoch": i + 1,
            "confidence": {"score": 0.5, "reasoning": "r"},
        }
        stored.append(unit)
        index.add(unit)
    query = relevance.Query(
        agent_id="zz",
        role="analyst",
        interests=interests,
        context_hint=hint,
        task_id=None,
        recency_weight=recency_weight,
        include_own=False,
        since_epoch=None,
    )
    rows = relevance.candidates(index, query)
    got = dict(zip(rows.tolist(), relevance.score(index, query, rows).tolist(), strict=True))
    expected = reference_scores(stored, query)
    assert {index.ids[r] for r in got} == expected.keys()
    for row, value in got.items():
        assert abs(value - expected[index.ids[row]]) < 1e-9
        assert 0.0 <= value <= 1.0


@settings(max_examples=60, deadline=None)
@given(st.lists(TEXT, min_size=1, max_size=30), st.data())
def test_a_text_embeds_alike_alone_and_in_a_batch_and_similarity_is_exact(
    texts: list[str], data: st.DataObject
) -> None:
    embedder = HashingEmbedder()
    batch = embedder.embed(texts)
    alone = np.concatenate([embedder.embed([text]) for text in texts])
    assert np.array_equal(batch, alone)
    norms = np.linalg.norm(batch, axis=1)
    assert np.allclose(norms[norms > 0], 1.0, atol=1e-6)
    # similarity of a few rows (gathered) equals the same rows of the whole product
    index = _index_of(texts)
    vector, square = index.embed(data.draw(TEXT))
    whole = index.similarity(vector, square)
    rows = np.array(data.draw(st.lists(st.integers(0, len(texts) - 1), max_size=3)), dtype=np.intp)
    assert np.array_equal(index.similarity(vector, square, rows), whole[rows])
    assert np.all(np.abs(whole) <= 1.0 + 1e-12)


def _index_of(texts: list[str]) -> relevance.UnitIndex:
    index = relevance.UnitIndex(HashingEmbedder())
    for i, text in enumerate(texts):
        unit = {
            "id": f"u{i}",
            "type": "finding",
            "content": text,
            "intent": {},
            "source": {"agent_id": "a", "agent_role": "r"},
            "status": "active",
            "epoch": i + 1,
        }
        index.add(unit)
    return index


def test_a_units_closeness_is_read_from_the_scoring_or_computed_alone_the_same() -> None:
    index = _index_of([f"pricing churn in segment {i}" for i in range(40)] + ["", "hiring"])
    query = relevance.Query(
        agent_id="b",
        role="analyst",
        interests=["pricing", "churn"],
        context_hint=None,
        task_id=None,
        recency_weight=0.25,
        include_own=False,
        since_epoch=None,
    )
    alone = [query.closeness(index, row) for row in range(len(index))]  # nothing scored yet
    scored = np.arange(0, len(index), 3)  # ascending, as candidates() gives them
    factor = query.semantic(index, scored)
    assert factor is not None
    assert [query.closeness(index, int(row)) for row in scored] == [
        (value, alone[row][1]) for value, row in zip(factor.tolist(), scored.tolist(), strict=True)
    ]
    assert [query.closeness(index, row) for row in range(len(index))] == alone
    assert {text for _, text in alone} == {"pricing", "churn"}  # the interest that matched
    nothing = dataclasses.replace(query, interests=[], context_hint=None)
    assert nothing.closeness(index, 0) is None


def test_query_texts_are_embedded_once_and_the_kept_ones_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    index = _index_of(["pricing"])
    calls: list[Sequence[str]] = []
    embed = index.embedder.embed

    def counted(texts: Sequence[str]) -> Any:
        calls.append(texts)
        return embed(texts)

    monkeypatch.setattr(index.embedder, "embed", counted)
    first = index.embed("pricing churn")
    again = index.embed("pricing churn")
    assert len(calls) == 1 and again is first
    fresh = relevance.UnitIndex(HashingEmbedder()).embed("pricing churn")
    assert np.array_equal(first[0], fresh[0]) and first[1] == fresh[1]
    for i in range(relevance.QUERY_TEXTS + 10):
        index.embed(f"text {i}")
    assert len(index._texts) == relevance.QUERY_TEXTS
    index.embed("pricing churn")  # evicted long ago: embedded again
    assert len(calls) == 1 + relevance.QUERY_TEXTS + 10 + 1


def test_quantized_rows_keep_the_cosine() -> None:
    embedder = HashingEmbedder()
    vectors = embedder.embed([CLOSE, UNRELATED, "pricing strategy", ""])
    rows, squares = quantize(vectors)
    assert np.array_equal(rows, np.rint(rows))  # integer-valued
    assert np.abs(rows).max() == 127
    assert squares[3] == 0.0 and not rows[3].any()
    exact = vectors @ vectors.T
    approx = embedding.cosine(rows @ rows.T, squares[:, None], squares[None, :])
    assert np.allclose(approx[:3, :3], exact[:3, :3], atol=0.02)


def test_embeddings_are_the_same_in_another_process() -> None:
    texts = [CLOSE, UNRELATED, "Größe des Marktes", ""]
    here = HashingEmbedder().embed(texts)
    script = (
        "import sys, numpy as np\n"
        "from field.ranking.embedding import HashingEmbedder\n"
        f"sys.stdout.write(HashingEmbedder().embed({texts!r}).tobytes().hex())\n"
    )
    for seed in ("0", "12345"):
        result = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        )
        there = np.frombuffer(bytes.fromhex(result.stdout), dtype=np.float32)
        assert np.array_equal(there.reshape(here.shape), here)


# -- the index and replay ---------------------------------------------------------


class CountingEmbedder:
    """The default embedder, counting its calls."""

    def __init__(self) -> None:
        self.inner = HashingEmbedder()
        self.calls: list[int] = []

    @property
    def name(self) -> str:
        return "counting"

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed(self, texts: Sequence[str]) -> Vectors:
        self.calls.append(len(texts))
        return self.inner.embed(texts)


def test_replay_embeds_in_batches_and_rebuilds_the_same_vectors() -> None:
    h = Harness()
    h.register("reader", "analyst", interests=INTERESTS)
    h.register("w1", "engineer")
    total = relevance.EMBED_BATCH * 2 + 5
    for i in range(total):
        h.record("w1", f"{CLOSE} {i}" if i % 2 else f"{UNRELATED} {i}")
    counting = CountingEmbedder()
    replayed = Field(embedder=counting)
    replayed.replay(h.stored())
    index, original = replayed.state.index, h.field.state.index
    assert np.array_equal(index.vectors, original.vectors)
    assert np.array_equal(index.squares, original.squares)
    assert counting.calls == [relevance.EMBED_BATCH, relevance.EMBED_BATCH, 5]
    assert index.vectors.shape == (total, 128)
    unit_id = index.ids[7]
    vector, square = index.vector(unit_id)
    assert np.array_equal(vector, original.vectors[7]) and square == original.squares[7]
    # the same ATTUNE answer after a restart
    replayed_h = Harness()
    replayed_h.field, replayed_h.tokens = h.replayed(), h.tokens
    replayed_h.epochs = dict(h.epochs)
    assert (
        replayed_h.attune("reader", max_units=20)["record"]
        == h.attune("reader", max_units=20)["record"]
    )


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=12), st.integers(0, 2**32 - 1))
def test_the_calibration_is_the_same_however_its_units_come(sizes: list[int], seed: int) -> None:
    """Units added a few at a time (summed without BLAS) or many at once: the sums at every
    checkpoint, and so the scales read from them, are the same to the bit."""
    rng = np.random.default_rng(seed)
    embedded = rng.standard_normal((sum(sizes), 128)).astype(np.float32)
    embedded[rng.random(len(embedded)) < 0.1] = 0.0  # zero rows (texts without a word)
    rows, squares = quantize(embedded)
    queries, query_squares = quantize(rng.standard_normal((5, 128)).astype(np.float32))

    def calibrated(pieces: list[int]) -> list[tuple[Any, Any]]:
        calibration = Calibration(128, prior_mean=LEXICAL.prior_mean, prior_sd=LEXICAL.prior_sd)
        start = 0
        for size in pieces:
            calibration.add(rows[start : start + size], squares[start : start + size])
            start += size
        return [
            calibration.scales(queries, query_squares, at)
            for at in range(len(calibration.checkpoints))
        ]

    assert FEW_ROWS < 40  # both ways of summing are taken
    for (scale, shift), (scale_at_once, shift_at_once) in zip(
        calibrated(sizes), calibrated([len(rows)]), strict=True
    ):
        assert np.array_equal(scale, scale_at_once) and np.array_equal(shift, shift_at_once)


def test_records_embed_a_bounded_batch_and_a_replay_a_large_one() -> None:
    """A record that fills the queue embeds EMBED_LIVE units (its batch waits for that
    alone), not EMBED_BATCH; a replay of the same log queues up to EMBED_BATCH before it
    embeds, and records after it are bounded again."""
    counting = CountingEmbedder()
    h = Harness(embedder=counting)
    h.register("w1", "engineer")
    total = relevance.EMBED_LIVE * 3 + 5
    for i in range(total):
        h.record("w1", f"{UNRELATED} {i}")
    assert relevance.EMBED_LIVE < total < relevance.EMBED_BATCH
    assert counting.calls == [relevance.EMBED_LIVE] * 3
    assert h.field.state.index.waiting == 5

    replaying = CountingEmbedder()
    replayed = Field(embedder=replaying)
    replayed.replay(h.stored())
    index = replayed.state.index
    assert replaying.calls == [] and index.waiting == total  # below EMBED_BATCH
    expected, _ = quantize(HashingEmbedder().embed([f"{UNRELATED} {i}" for i in range(total)]))
    assert np.array_equal(index.vectors, expected)  # read: embedded in one call
    assert replaying.calls == [total]
    unit = h.field.state.units[index.ids[0]]
    for i in range(relevance.EMBED_LIVE):  # live again: a bounded batch
        index.add({**unit, "id": f"more-{i}", "content": f"more {i}"})
    assert replaying.calls == [total, relevance.EMBED_LIVE]
    with index.in_bulk(), index.in_bulk():  # a replay within a replay
        pass
    for i in range(relevance.EMBED_LIVE):  # and live again after both
        index.add({**unit, "id": f"last-{i}", "content": f"last {i}"})
    assert replaying.calls == [total, relevance.EMBED_LIVE, relevance.EMBED_LIVE]


def test_a_live_record_is_embedded_before_it_is_read() -> None:
    h = Harness()
    close, _ = _two_units(h)
    index = h.field.state.index
    assert index.vectors.shape == (2, 128)
    h.record("w1", "a third unit")
    assert index.vectors.shape == (3, 128)  # embedded on the first read
    assert index.rows[close] == 0


# -- subscription matching ----------------------------------------------------------


def test_a_subscriber_is_notified_of_a_semantically_close_unit_matching_no_keyword() -> None:
    h = Harness()
    h.register("reader", "analyst", interests=INTERESTS)
    h.register("w1", "engineer")
    h.register("w2", "engineer")
    sub = subscribe(h, "reader", ["memory.recorded"], min_relevance=LEXICAL.threshold)
    loose = subscribe(h, "reader", ["memory.recorded"])
    h.record("w2", UNRELATED, score=0.5)
    h.record("w1", CLOSE, score=0.5)
    got = notified(h, sub)
    assert len(got) == 1
    ((position, (_, relevance_score, _)),) = got.items()
    everything = notified(h, loose)
    scores = sorted(rel for _, rel, _ in everything.values())
    assert len(scores) == 2 and scores[0] < LEXICAL.threshold <= scores[1] == relevance_score
    match = next(m for m in matcher_of(h).match(events_of(h)) if m.event.position == position)
    assert "close in meaning to your interests" in match.reason(0)
    check_against_reference(h)
    check_splits(h)


def test_profiles_without_interests_score_without_the_semantic_factor() -> None:
    h = Harness()
    h.register("plain", "analyst")
    h.register("w1", "engineer")
    h.register("w2", "engineer")
    sub = subscribe(h, "plain", ["memory.recorded"])
    h.record("w1", CLOSE, score=0.5)
    h.record("w2", UNRELATED, score=0.5)
    got = notified(h, sub)
    assert len(got) == 2
    registry = h.field.state.registry
    assert registry.interest_count.view[registry.profile.view[registry.rows[sub]]] == 0
    check_against_reference(h)


async def test_a_push_subscriber_gets_the_semantically_close_unit_over_websocket(
    field_server: ThreadedServer,
) -> None:
    async with FieldClient(field_server.url) as client:
        reader = await client.register("reader", "analyst", interests=INTERESTS)
        writer = await client.register("writer", "engineer")
        payload = {
            "action": "subscribe",
            "subscription": {"events": ["memory.recorded"], "min_relevance": LEXICAL.threshold},
        }
        subscribed = await reader.send("SUBSCRIBE", payload)
        async with open_ws(field_server, reader.token) as ws:
            await ws.ready()
            await record(writer, UNRELATED, confidence=0.5)
            close = await record(writer, CLOSE, confidence=0.5)
            (notification,) = await ws.notifications(1)
    assert notification["subscription_id"] == subscribed["subscription_id"]
    assert notification["memory_unit_id"] == close["memory_unit_id"]
    assert notification["relevance_score"] >= LEXICAL.threshold
    assert "close in meaning to your interests" in notification["relevance_reason"]


# -- token budgets -------------------------------------------------------------------


def test_max_tokens_holds_with_semantic_ranking() -> None:
    h = Harness()
    h.register("reader", "analyst", interests=INTERESTS)
    for i in range(12):
        h.register(f"w{i}", "engineer")
        long = f"{CLOSE if i % 3 == 0 else UNRELATED}. " + "detail " * (40 * (i % 4))
        h.record(f"w{i}", long, score=0.5)
    unlimited = h.attune("reader", max_units=12)["record"]
    order = [item["memory_unit"]["id"] for item in unlimited]
    for budget in (60, 150, 400, 2000):
        response = h.attune("reader", max_units=12, max_tokens=budget)
        used = response["context_budget"]["tokens_used"]
        assert used <= budget
        got = [item["memory_unit"]["id"] for item in response["record"]]
        assert got == order[: len(got)]  # the best units, in rank order, summarized if need be
        scores = [item["relevance_score"] for item in response["record"]]
        assert scores == sorted(scores, reverse=True)
        assert used == sum(tokens(item["memory_unit"]) for item in response["record"])


# -- choosing an embedder --------------------------------------------------------------


def test_the_default_embedder_is_reported_in_the_capabilities() -> None:
    h = Harness()
    response = h.register("a", "analyst")
    assert response["field_capabilities"]["embedder"] == "hashing-128"
    assert_valid("field-capabilities", response["field_capabilities"])
    assert Field(embedder=HashingEmbedder(64)).capabilities()["embedder"] == "hashing-64"


def test_embedder_names() -> None:
    assert load_embedder("hashing").name == "hashing-128"
    assert load_embedder("hashing-128").dim == 128
    for bad in ("hashing-100", "word2vec", "sentence-transformers:", ""):
        with pytest.raises(EmbedderError):
            load_embedder(bad)
    assert Config.from_env({"FIELD_EMBEDDER": "hashing-64"}).embedder == "hashing-64"
    assert Config.from_env({}, embedder="hashing-64").embedder == "hashing-64"


def test_sentence_transformers_missing_package_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(EmbedderError, match=r"needs the sentence-transformers package"):
        load_embedder("sentence-transformers:all-MiniLM-L6-v2")


class _FakeModel:
    """Stands in for sentence_transformers.SentenceTransformer (records how it was loaded)."""

    loaded: list[tuple[str, dict[str, Any]]] = []

    def __init__(self, name: str, **options: Any) -> None:
        if name == "missing":
            raise OSError("We couldn't connect to the hub\nand local files are absent")
        self.loaded.append((name, options))

    def get_sentence_embedding_dimension(self) -> int:
        return 8

    def encode(self, texts: list[str], **options: Any) -> Any:
        assert options["normalize_embeddings"] is True
        out = np.zeros((len(texts), 8), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i, len(text) % 8] = 1.0
        return out


def test_sentence_transformers_loads_local_files_only(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("sentence_transformers")
    fake.SentenceTransformer = _FakeModel  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sentence_transformers", fake)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(EmbedderError, match=r"cannot load .*'missing' from local files") as info:
        load_embedder("sentence-transformers:missing")
    assert "\n" not in str(info.value)
    embedder = load_embedder("sentence-transformers:/models/mini")
    assert _FakeModel.loaded[-1] == ("/models/mini", {"device": "cpu", "local_files_only": True})
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert embedder.name == "sentence-transformers:/models/mini" and embedder.dim == 8
    h = Harness(embedder=embedder)
    h.register("reader", "analyst", interests=["abc"])
    h.register("w", "engineer")
    h.record("w", "xyz")  # same length as the interests: the same fake vector
    (item,) = h.attune("reader")["record"]
    assert 'close in meaning to your interest "abc" (closer than' in item["relevance_reason"]
    assert h.field.capabilities()["embedder"] == "sentence-transformers:/models/mini"


@pytest.mark.parametrize("spec", ["sentence-transformers:no-such-model", "nonsense", "hashing-3"])
def test_serve_with_an_unavailable_embedder_exits_2_with_one_line(spec: str) -> None:
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
    assert "embedder" in lines[0]


def test_an_agent_of_many_interests_costs_a_bounded_number_of_embeddings() -> None:
    """An agent may register 64 interests; a query embeds the first 16 of them, the hint and
    their joined text, and no more, and its profile in the registry holds as many rows."""
    embedded: list[str] = []

    class Counting(HashingEmbedder):
        def embed(self, texts: Sequence[str]) -> Vectors:
            embedded.extend(texts)
            return super().embed(texts)

    h = Harness(embedder=Counting())
    interests = [f"pricing plan number {i}" for i in range(64)]
    h.register("many", "analyst", interests=interests)
    h.register("w", "engineer")
    h.record("w", "pricing plan number 40 went up", score=0.5)
    h.field.state.index.vectors  # noqa: B018 - the unit's content is embedded first
    embedded.clear()
    (item,) = h.attune("many", context_hint="a hint about plans")["record"]
    queried = set(embedded)
    assert len(queried) <= relevance.COMPARED_INTERESTS + 2  # the hint and the joined text
    assert set(interests[:16]) <= queried and not set(interests[16:]) & queried
    sub = subscribe(h, "many", ["memory.recorded"])
    registry = h.field.state.registry
    profile = registry.profile.view[registry.rows[sub]]
    assert registry.interest_count.view[profile] == relevance.COMPARED_INTERESTS
    assert registry.interests(int(profile)).joined is not None
    check_against_reference(h)


def test_the_registry_keeps_the_scales_of_its_last_checkpoints_and_makes_others_again() -> None:
    """The registry's cache of interest scales holds KEPT_SCALES checkpoints: asking for one
    more drops the least recently used, which is computed again, to the same values."""
    h = Harness()
    h.register("reader", "analyst", interests=["pricing", "churn"])
    subscribe(h, "reader", ["memory.recorded"])
    registry = h.field.state.registry
    calibration = Calibration(128, prior_mean=LEXICAL.prior_mean, prior_sd=LEXICAL.prior_sd)
    rows, squares = quantize(HashingEmbedder().embed([f"unit {i} of many" for i in range(1024)]))
    calibration.add(rows, squares)
    assert len(calibration.checkpoints) == KEPT_SCALES + 1  # 0, 8, 16, ..., 1024
    made: list[int] = []
    scales = calibration.scales

    def counted(vectors: Any, squares: Any, at: int) -> Any:
        made.append(at)
        return scales(vectors, squares, at)

    calibration.scales = counted  # type: ignore[method-assign]
    first = [a.copy() for a in registry.scales(calibration, 0)]
    for position in range(1, KEPT_SCALES):
        registry.scales(calibration, position)
    registry.scales(calibration, 0)  # kept: the most recently used now
    assert made == list(range(KEPT_SCALES))
    registry.scales(calibration, KEPT_SCALES)  # one more: position 1, the oldest, goes
    registry.scales(calibration, 0)
    assert made[-1] == KEPT_SCALES
    again = registry.scales(calibration, 1)
    assert made[-1] == 1  # made again
    assert [a.tolist() for a in registry.scales(calibration, 0)] == [a.tolist() for a in first]
    assert len(again[0]) == registry.squares.size  # a scale per interest row
