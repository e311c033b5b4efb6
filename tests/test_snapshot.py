"""Snapshots in the pure core: a state through a snapshot is the state a full replay builds.

Random histories (``snapshot_cases``) are cut at a random position; the
state folded up to there goes through a snapshot (compacted, encoded,
checked, decoded) and the rest of the log is folded on top. It must equal
the state a full replay builds in every registry and every read, match
every event as it does, and go on alike through the same later operations.
Snapshots that are damaged, truncated, foreign or too new are refused, and
their bodies may name nothing but the classes a state is made of.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from field.contract.model import Limits, StoredEntry
from field.core import snapshot
from field.core.field import Field
from field.core.snapshot import FORMAT, Header, UnusableSnapshot
from field.ranking.embedding import HashingEmbedder

from . import snapshot_cases as cases
from .core_util import Harness

FINGERPRINT = "fingerprint-of-these-tests"
HISTORY = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def new_field(h: Harness) -> Field:
    """A Field as ``h``'s would be after a restart: same clock, ids and operator."""
    return Field(
        now=lambda: h.time,
        ids=h.ids,
        operator_token=cases.OPERATOR_TOKEN,
        read_entries=h.read_positions,
    )


def replayed(h: Harness, entries: list[StoredEntry]) -> Field:
    field = new_field(h)
    field.replay(entries)
    return field


def snapshot_of(field: Field) -> bytes:
    """The bytes of a snapshot of ``field``'s state, as ``field snapshot`` writes one."""
    state = field.state
    snapshot.compact(state)
    header = Header(
        format=FORMAT,
        field_id=state.field_id or "",
        position=state.last_position,
        written_at=1_780_000_000.0,
        fingerprint=FINGERPRINT,
        anchor={},
        units=len(state.units),
    )
    return snapshot.encoded(state, header)


def restored(h: Harness, data: bytes, rest: list[StoredEntry]) -> Field:
    field = new_field(h)
    header, state = snapshot.decode(data, FINGERPRINT, limits=field.limits, embedder=field.embedder)
    assert header.position == state.last_position
    field.restore(state)
    field.replay(rest)
    return field


def through_snapshot(h: Harness, cut: int) -> Field:
    """A Field started from a snapshot at position ``cut`` of ``h``'s log, then its tail."""
    stored = h.stored()
    return restored(h, snapshot_of(replayed(h, stored[:cut])), stored[cut:])


def played(steps: list[Any]) -> Harness:
    h = cases.harness()
    for step in steps:
        cases.play(h, step)
    return h


# -- the property ------------------------------------------------------------------------


@HISTORY
@given(cases.histories, st.floats(0.0, 1.0))
def test_a_start_from_a_snapshot_is_a_full_replay(steps: list[Any], where: float) -> None:
    h = played(steps)
    stored = h.stored()
    cut = 1 + round(where * (len(stored) - 1))
    full = replayed(h, stored)
    started = through_snapshot(h, cut)
    assert cases.canonical(started.state) == cases.canonical(full.state)
    assert cases.matches(started.state, started, stored) == cases.matches(full.state, full, stored)
    assert cases.observe(started, h.tokens) == cases.observe(full, h.tokens)
    # the lookups above bring back the rows a snapshot leaves out: the same rows
    assert cases.canonical(started.state) == cases.canonical(full.state)


@HISTORY
@given(cases.histories, cases.histories)
def test_a_field_restarted_from_a_snapshot_goes_on_as_after_a_full_replay(
    before: list[Any], after: list[Any]
) -> None:
    by_replay, by_snapshot = played(before), played(before)  # their ids and clocks in step
    assert [e.kind for e in by_snapshot.entries] == [e.kind for e in by_replay.entries]
    by_snapshot.entries = list(by_replay.entries)  # one log (secrets are made at random)
    stored = by_replay.stored()
    by_replay.field = replayed(by_replay, stored)
    by_snapshot.field = through_snapshot(by_snapshot, len(stored))
    for step in after:
        expected = cases.unsealed(cases.play(by_replay, step))
        assert cases.unsealed(cases.play(by_snapshot, step)) == expected, step
    assert cases.unsealed(cases.canonical(by_snapshot.field.state)) == cases.unsealed(
        cases.canonical(by_replay.field.state)
    )
    assert cases.observe(by_snapshot.field, by_snapshot.tokens) == cases.observe(
        by_replay.field, by_replay.tokens
    )


@pytest.mark.parametrize("seed", range(4))
def test_long_random_histories_cut_anywhere(seed: int) -> None:
    h = played(cases.random_history(seed, 800))
    stored = h.stored()
    full = replayed(h, stored)
    expected = cases.canonical(full.state), cases.matches(full.state, full, stored)
    for cut in (1, len(stored) // 3, len(stored) - 1, len(stored)):
        started = through_snapshot(h, cut)
        assert cases.canonical(started.state) == expected[0], cut
        assert cases.matches(started.state, started, stored) == expected[1], cut
    assert cases.observe(started, h.tokens) == cases.observe(full, h.tokens)


def test_a_snapshot_of_a_snapshot_start_is_the_same_state() -> None:
    h = played([("register", i, i, i) for i in range(4)] + [("record", i, i, 2) for i in range(9)])
    stored = h.stored()
    once = through_snapshot(h, len(stored) // 2)
    twice = restored(h, snapshot_of(once), [])
    assert cases.canonical(twice.state) == cases.canonical(replayed(h, stored).state)


# -- what a snapshot leaves out ------------------------------------------------------------


def subscribed_and_cancelled(count: int) -> Harness:
    """An agent that subscribed ``count`` times and cancelled all but the last."""
    h = cases.harness()  # ann is an analyst interested in "market size"
    ids = []
    for i in range(count):
        payload = {"action": "subscribe", "subscription": {"events": ["memory.recorded"]}}
        ids.append(h.send("SUBSCRIBE", "ann", payload)["subscription_id"])
        h.record("lead", f"market size finding {i}")
    for subscription_id in ids[:-1]:
        h.send(
            "SUBSCRIBE", "ann", {"action": "unsubscribe", "subscription": {"id": subscription_id}}
        )
    return h


def test_cancelled_subscriptions_leave_the_matchers_registry() -> None:
    h = subscribed_and_cancelled(30)
    full = replayed(h, h.stored())
    started = through_snapshot(h, len(h.entries))
    assert len(full.state.registry) == 30
    assert len(started.state.registry) == 1
    assert len(started.state.registry.retired) == 29
    assert started.state.subscriptions == full.state.subscriptions  # still known, cancelled
    stored = h.stored()
    assert cases.matches(started.state, started, stored) == cases.matches(full.state, full, stored)
    assert len(started.state.registry) == 30  # a replay to its end brought each back


def test_a_deregistered_agents_profiles_go_with_its_rows() -> None:
    h = subscribed_and_cancelled(3)
    h.send(
        "SUBSCRIBE", "bob", {"action": "subscribe", "subscription": {"events": ["task.assigned"]}}
    )
    h.send("DEREGISTER", "ann", {"agent_id": "ann"})
    started = through_snapshot(h, len(h.entries))
    registry = started.state.registry
    assert registry.profile_count == 1  # bob's: ann's registration is gone, with its rows
    assert [registry.profile_agent[0]["id"]] == ["bob"]
    assert cases.canonical(started.state) == cases.canonical(replayed(h, h.stored()).state)


def test_empty_per_agent_sets_are_left_out() -> None:
    h = subscribed_and_cancelled(1)
    sid = h.send("SUBSCRIBE", "ann", {"action": "list"})["subscriptions"][0]["id"]
    h.send("SUBSCRIBE", "ann", {"action": "unsubscribe", "subscription": {"id": sid}})
    assert replayed(h, h.stored()).state.active_subscriptions == {"ann": set()}
    assert through_snapshot(h, len(h.entries)).state.active_subscriptions == {}


# -- snapshots that are not read -------------------------------------------------------------


@pytest.fixture(scope="module")
def good() -> bytes:
    h = played([("register", i, i, i) for i in range(3)] + [("record", i, i, 1) for i in range(5)])
    return snapshot_of(replayed(h, h.stored()))


def refused(data: bytes, fingerprint: str = FINGERPRINT) -> str:
    with pytest.raises(UnusableSnapshot) as caught:
        snapshot.decode(data, fingerprint, limits=Limits(), embedder=HashingEmbedder())
    assert caught.value.code == "INTERNAL_ERROR" and not caught.value.recoverable
    return caught.value.message


def test_a_snapshot_is_handed_over_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot, "CHUNK_BYTES", 1000)
    h = played([("register", i, i, i) for i in range(3)] + [("record", i, i, 1) for i in range(40)])
    state = replayed(h, h.stored()).state
    pieces: list[bytes] = []
    header = snapshot.read_header(snapshot_of(replayed(h, h.stored())))
    snapshot.encode(state, header, pieces.append)
    body = pieces[1:-1]  # between the header and the trailer
    assert len(body) > 10 and all(len(piece) == 1000 for piece in body[:-1])
    assert 0 < len(body[-1]) <= 1000
    decoded = snapshot.decode(
        b"".join(pieces), FINGERPRINT, limits=Limits(), embedder=HashingEmbedder()
    )
    assert cases.canonical(decoded[1]) == cases.canonical(replayed(h, h.stored()).state)


def test_a_good_snapshot_is_read(good: bytes) -> None:
    header, state = snapshot.decode(good, FINGERPRINT, limits=Limits(), embedder=HashingEmbedder())
    assert (header.position, header.units) == (state.last_position, len(state.units))
    assert snapshot.read_header(good[:4096]) == header


@pytest.mark.parametrize("size", [0, 5, 12, 100, -33, -1])
def test_a_truncated_snapshot_is_refused(good: bytes, size: int) -> None:
    message = refused(good[:size])
    assert any(word in message for word in ("shorter", "truncated", "checksum", "begin"))


@pytest.mark.parametrize("where", [0.0, 0.01, 0.5, 0.99])
def test_a_corrupted_byte_is_refused(good: bytes, where: float) -> None:
    damaged = bytearray(good)
    damaged[int(where * (len(good) - 1))] ^= 0x40
    refused(bytes(damaged))


def test_another_projection_is_refused(good: bytes) -> None:
    assert "another projection" in refused(good, "the fingerprint of another embedder")


def test_a_newer_format_is_refused(good: bytes) -> None:
    assert "newer" in refused(cases.rewritten(good, format=FORMAT + 1))


def test_a_body_naming_anything_else_is_refused(good: bytes) -> None:
    head = snapshot.read_header(good).to_json()

    class Evil:
        def __reduce__(self) -> Any:
            return (print, ("owned",))

    for body in (pickle.dumps(Evil(), protocol=5), pickle.dumps(Limits(), protocol=5)):
        assert "which a state never holds" in refused(cases.sealed(head, body))
    assert "not a state" in refused(cases.sealed(head, pickle.dumps({"a": 1}, protocol=5)))
    assert "cannot be read" in refused(cases.sealed(head, b"\x80\x05garbage"))
