"""The per-consumer Stream: cursor, debounce windows, resume; and the cursor wire form.

Pure tests: no event loop, no sleeps. Times are log timestamps passed in.
Timestamps are whole "ticks" of 1/1024 s, so that seconds, milliseconds
and window boundaries are exact in floating point and the model below
can compute windows with integers (see ``test_window_arithmetic_*`` for
what happens with arbitrary floats).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from field.subscriptions.events import FieldEvent
from field.subscriptions.stream import (
    MAX_CURSOR_CHARS,
    Notification,
    Stream,
    format_cursor,
    parse_cursor,
)

TICKS = 1024  # per second
BASE = 1_780_000_000 * TICKS  # a 2026 timestamp, in ticks


def seconds(ticks: int) -> float:
    return ticks / TICKS  # exact: ticks < 2**53


def make_event(
    position: int, ts: float, entity: str = "x", entity_type: str = "memory_unit"
) -> FieldEvent:
    return FieldEvent(
        position=position,
        epoch=position,
        ts=ts,
        name="memory.recorded",
        actor="someone",
        entity_type=entity_type,
        entity_id=entity,
        summary=f"event {position}",
    )


def note(
    position: int, ts: float, entity: str = "x", entity_type: str = "memory_unit"
) -> Notification:
    return Notification(
        subscription_id="sub-1",
        event=make_event(position, ts, entity, entity_type),
        relevance=0.5,
        reason="because",
        requires_action=False,
    )


def summary(notifications: list[Notification]) -> list[tuple[int, int]]:
    return [(n.position, n.folded) for n in notifications]


# -- no debounce -----------------------------------------------------------------


def test_window_zero_delivers_immediately_in_order_skipping_seen_positions() -> None:
    stream = Stream("sub-1", window_ms=0, after=3)
    t = seconds(BASE)
    assert stream.offer(note(2, t)) == []  # at or before the cursor: already seen
    assert stream.offer(note(3, t)) == []
    assert stream.after == 3
    for position in (4, 6, 9):
        first = note(position, t, entity="x")  # one entity: never folded without a window
        assert stream.offer(first) == [first]
        assert first.folded == 0
        assert stream.after == position
        assert stream.deadline is None
    assert stream.advance(t + 100) == []
    assert stream._pending is None


# -- debounce windows -----------------------------------------------------------------


def test_one_entity_in_a_window_folds_into_its_latest_event() -> None:
    stream = Stream("sub-1", window_ms=1000, after=0)
    start = seconds(BASE)  # BASE is a whole second: a window boundary
    assert stream.window_of(start + 0.5) == stream.window_of(start)
    assert stream.offer(note(1, start + 0.0, "x")) == []
    assert stream.deadline == start + 1.0
    assert stream.offer(note(2, start + 0.25, "x")) == []
    assert stream.offer(note(5, start + 0.5, "x")) == []
    assert stream.advance(start + 0.75) == []  # the window has not ended
    delivered = stream.advance(start + 1.0)  # ... now it has, exactly
    assert summary(delivered) == [(5, 2)]
    assert delivered[0].event.summary == "event 5"  # the latest state
    assert stream.after == 5
    assert stream.deadline is None
    assert stream._pending is None  # no window open: no dict held (thousands of idle streams)
    assert stream.advance(start + 5.0) == []


def test_a_window_is_delivered_when_an_event_of_a_later_window_arrives() -> None:
    stream = Stream("sub-1", window_ms=250, after=0)
    start = seconds(BASE)
    assert stream.offer(note(1, start, "x")) == []
    assert stream.offer(note(2, start + 0.125, "x")) == []
    due = stream.offer(note(3, start + 0.25, "x"))  # first instant of the next window
    assert summary(due) == [(2, 1)]
    assert stream.deadline == start + 0.5
    assert summary(stream.advance(start + 0.5)) == [(3, 0)]  # a new window, counted afresh


def test_entities_of_one_window_are_delivered_together_by_position() -> None:
    stream = Stream("sub-1", window_ms=1000, after=0)
    start = seconds(BASE)
    stream.offer(note(1, start, "x"))
    stream.offer(note(2, start + 0.125, "y"))
    stream.offer(note(3, start + 0.25, "x"))  # x's latest is now after y's
    stream.offer(note(4, start + 0.25, "x", entity_type="conflict"))  # another entity
    stream.offer(note(5, start + 0.5, "z"))
    delivered = stream.offer(note(6, start + 1.5, "y"))
    assert summary(delivered) == [(2, 0), (3, 1), (4, 0), (5, 0)]
    assert [n.event.entity_key for n in delivered] == [
        "memory_unit:y",
        "memory_unit:x",
        "conflict:x",
        "memory_unit:z",
    ]


def test_positions_at_or_before_the_cursor_count_as_folded_but_are_not_redelivered() -> None:
    stream = Stream("sub-1", window_ms=1000, after=4)
    start = seconds(BASE)
    stream.offer(note(2, start, "x"))
    stream.offer(note(3, start, "y"))
    stream.offer(note(4, start + 0.5, "y"))
    stream.offer(note(7, start + 0.5, "x"))
    # y's final state (4) was already seen; x's (7) replaces 2
    assert summary(stream.advance(start + 1)) == [(7, 1)]
    assert stream.after == 7


# -- the model: what a stream must deliver ---------------------------------------------


@dataclass(frozen=True)
class Entry:
    """A log entry: matched entries are offered to the stream."""

    position: int
    ticks: int
    matched: bool
    entity: str
    entity_type: str


def window_of(ticks: int, window_ms: int) -> int:
    """The window of a timestamp, in exact integer arithmetic."""
    return (ticks * 1000) // (TICKS * window_ms)


def window_ended(window: int, window_ms: int, now_ticks: int) -> bool:
    return now_ticks * 1000 >= (window + 1) * window_ms * TICKS


def next_boundary(ticks: int, window_ms: int) -> int:
    """The first window boundary after ``ticks`` that is a whole tick."""
    if not window_ms:
        return ticks + 128
    ticks += 1
    while (ticks * 1000) % (TICKS * window_ms):
        ticks += 1
    return ticks


class Model:
    """The documented behaviour, restated: deliveries per call, by exact windows."""

    def __init__(self, window_ms: int, after: int) -> None:
        self.window_ms = window_ms
        self.after = after
        self.groups: dict[tuple[str, int], list[Entry]] = {}

    def _due(self, now_ticks: int | None) -> list[tuple[int, int, str]]:
        due = []
        for (key, window), group in list(self.groups.items()):
            if now_ticks is None or window_ended(window, self.window_ms, now_ticks):
                del self.groups[(key, window)]
                last = group[-1]
                due.append((last.position, len(group) - 1, key))
        due.sort()
        fresh = [d for d in due if d[0] > self.after]
        if fresh:
            self.after = fresh[-1][0]
        return fresh

    def offer(self, entry: Entry) -> list[tuple[int, int, str]]:
        key = f"{entry.entity_type}:{entry.entity}"
        if not self.window_ms:
            if entry.position > self.after:
                self.after = entry.position
                return [(entry.position, 0, key)]
            return []
        due = self._due(entry.ticks)
        window = window_of(entry.ticks, self.window_ms)
        self.groups.setdefault((key, window), []).append(entry)
        return due

    def advance(self, now_ticks: int | None) -> list[tuple[int, int, str]]:
        """None: the end of time."""
        return [] if not self.window_ms else self._due(now_ticks)


def to_notification(entry: Entry) -> Notification:
    return note(entry.position, seconds(entry.ticks), entry.entity, entry.entity_type)


def triples(notifications: list[Notification]) -> list[tuple[int, int, str]]:
    return [(n.position, n.folded, n.event.entity_key) for n in notifications]


WINDOWS = [0, 1, 2, 3, 7, 10, 100, 125, 250, 500, 1000]


def entry_specs(window_ms: int) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    """Log entries; gaps are often whole (fractions of) windows, to land on boundaries."""
    window_ticks = window_ms * TICKS / 1000
    aligned = [int(window_ticks * f) for f in (1, 0.5, 0.25) if (window_ticks * f).is_integer()]
    gap = st.one_of(
        st.just(0),
        st.just(-1),  # to the next window boundary that falls on a whole tick
        st.integers(0, 12),
        st.sampled_from([g for g in aligned if g] or [128, 256, 512, TICKS]),
        st.integers(0, 2 * TICKS),
    )
    entry = st.tuples(
        st.integers(1, 3),  # position step (the gaps are other subscriptions' entries)
        gap,  # ticks since the previous entry
        st.booleans() | st.just(True),  # matched (offered to this stream)
        st.sampled_from(["x", "y", "z"]),
        st.sampled_from(["memory_unit", "conflict"]),
        # an advance() this far into the gap (1.0: at the entry's own time), or none
        st.one_of(st.none(), st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0)),
    )
    return st.lists(entry, min_size=2, max_size=40)


scenarios = st.sampled_from(WINDOWS).flatmap(
    lambda window_ms: st.tuples(
        entry_specs(window_ms),
        st.just(window_ms),
        st.integers(0, 30),  # the first run's own starting cursor
        # where the run starts: often on a whole second (every window's boundary)
        st.one_of(st.sampled_from([0, 128, 256, 512]), st.integers(0, 3 * TICKS)),
    )
)


@dataclass
class Run:
    """The first run: every call's deliveries, and the cursor after each call."""

    entries: list[Entry]
    calls: list[tuple[str, Any]]
    delivered: list[list[Notification]]
    cursors: list[int]


def first_run(
    specs: list[tuple[Any, ...]], window_ms: int, after: int, offset: int
) -> tuple[Run, Model]:
    entries: list[Entry] = []
    calls: list[tuple[str, Any]] = []
    position, ticks = 0, BASE + offset
    for step, since, matched, entity, entity_type, advance_at in specs:
        if advance_at is not None:  # the consumer's clock ticks between log entries
            calls.append(("advance", ticks + math.floor(advance_at * since)))
        position += step
        ticks = next_boundary(ticks, window_ms) if since < 0 else ticks + since
        entry = Entry(position, ticks, matched, entity, entity_type)
        entries.append(entry)
        if matched:
            calls.append(("offer", entry))
    calls.append(("advance", None))  # much later: everything pending is due

    stream = Stream("sub-1", window_ms=window_ms, after=after)
    model = Model(window_ms, after)
    delivered: list[list[Notification]] = []
    cursors: list[int] = [stream.after]
    for kind, arg in calls:
        if kind == "offer":
            got = stream.offer(to_notification(arg))
            want = model.offer(arg)
        else:
            now = seconds(ticks + 10 * 3_600 * TICKS) if arg is None else seconds(arg)
            got = stream.advance(now)
            want = model.advance(arg)
        assert triples(got) == want, (kind, arg)
        delivered.append(got)
        cursors.append(stream.after)
        assert stream.after == model.after
    assert stream.deadline is None
    return Run(entries, calls, delivered, cursors), model


def replay(run: Run, window_ms: int, cursor: int) -> list[Notification]:
    """A fresh stream from ``cursor``, offered the log from the start of its window."""
    stream = Stream("sub-1", window_ms=window_ms, after=cursor)
    at = [e for e in run.entries if e.position == cursor]
    first = stream.window_of(seconds(at[0].ticks)) if at else None
    out: list[Notification] = []
    for entry in run.entries:
        in_range = first is None or stream.window_of(seconds(entry.ticks)) >= first
        if entry.matched and in_range:
            out += stream.offer(to_notification(entry))
    out += stream.advance(math.inf)
    return out


@settings(max_examples=400, deadline=None)
@given(scenarios)
def test_streams_deliver_as_documented_and_resume_exactly(
    scenario: tuple[list[tuple[Any, ...]], int, int, int],
) -> None:
    specs, window_ms, after, offset = scenario
    run, _ = first_run(specs, window_ms, after, offset)
    everything = [n for batch in run.delivered for n in batch]
    offered = [e for e in run.entries if e.matched]

    # delivered cursors strictly increase, and all lie after the starting cursor
    positions = [n.position for n in everything]
    assert positions == sorted(set(positions))
    assert all(p > after for p in positions)
    # never two deliveries for one entity in one window
    if window_ms:
        windows = [
            (n.event.entity_key, window_of(round(n.event.ts * TICKS), window_ms))
            for n in everything
        ]
        assert len(windows) == len(set(windows))
    # the final state of every entity is always delivered (unless already seen)
    last: dict[str, Entry] = {}
    for entry in offered:
        last[f"{entry.entity_type}:{entry.entity}"] = entry
    for entry in last.values():
        if entry.position > after:
            assert entry.position in positions
    # folded counts account for every offered event after the first run's cursor
    for n in everything:
        assert n.folded >= 0
    if window_ms == 0:
        assert positions == [e.position for e in offered if e.position > after]
        assert all(n.folded == 0 for n in everything)
    else:
        assert sum(n.folded + 1 for n in everything) <= len(offered)
        # no notification waits past the end of its window
        call_times = [arg.ticks if kind == "offer" else arg for kind, arg in run.calls]
        for i, batch in enumerate(run.delivered):
            for n in batch:
                window = window_of(round(n.event.ts * TICKS), window_ms)
                now = call_times[i]
                assert now is None or window_ended(window, window_ms, now)
                earlier = [t for t in call_times[:i] if t is not None]
                assert not any(window_ended(window, window_ms, t) for t in earlier)

    # resume: from any cursor the first run handed out, a fresh stream delivers the rest
    for k, cursor in enumerate(run.cursors):
        done = sum(len(batch) for batch in run.delivered[:k])
        rest = replay(run, window_ms, cursor)
        assert summary(rest) == summary(everything[done:]), (k, cursor)


def test_resume_from_the_middle_of_a_debounced_stream() -> None:
    """A hand-made case of the resume guarantee."""
    # window 0: x twice, y once; window 1: x once; window 2: y, x, y (1024 ticks a window)
    timeline = [(0, "x"), (100, "y"), (200, "x"), (1100, "x"), (2050, "y"), (2060, "x")]
    timeline.append((2070, "y"))
    entries = [
        Entry(10 * (i + 1), BASE + t, matched=True, entity=e, entity_type="memory_unit")
        for i, (t, e) in enumerate(timeline)
    ]
    stream = Stream("sub-1", window_ms=1000, after=0)
    batches = [stream.offer(to_notification(e)) for e in entries]
    batches.append(stream.advance(math.inf))
    expected: list[list[tuple[int, int]]] = [[], [], [], [(20, 0), (30, 1)], [(40, 0)]]
    expected += [[], [], [(60, 0), (70, 1)]]
    assert [summary(b) for b in batches] == expected
    run = Run(entries, [("offer", e) for e in entries], batches, [])
    assert summary(replay(run, 1000, 30)) == [(40, 0), (60, 0), (70, 1)]
    assert summary(replay(run, 1000, 40)) == [(60, 0), (70, 1)]
    assert summary(replay(run, 1000, 70)) == []


# -- window arithmetic with arbitrary float timestamps ------------------------------------


def test_window_arithmetic_near_a_boundary() -> None:
    """Membership and window ends are both decided by window_of, so they never disagree."""
    window_ms = 3
    boundary = 1_780_000_000.176  # a window boundary: 593333333392 * 3 ms
    just_before = math.nextafter(boundary, 0.0)  # 1780000000.1759999, a real time.time() value
    times = [1_780_000_000.174, just_before, 1_780_000_000.178]
    stream = Stream("sub-1", window_ms=window_ms, after=0)
    delivered: list[Notification] = []
    for position, ts in enumerate(times, start=1):
        delivered += stream.offer(note(position, ts, "x"))
        assert stream.advance(ts) == []  # a window never ends at one of its own times
    delivered += stream.advance(math.inf)
    groups: list[list[int]] = []
    for position, ts in enumerate(times, start=1):
        if groups and stream.window_of(times[groups[-1][-1] - 1]) == stream.window_of(ts):
            groups[-1].append(position)
        else:
            groups.append([position])
    assert summary(delivered) == [(group[-1], len(group) - 1) for group in groups]


def test_window_arithmetic_with_tick_timestamps_is_exact() -> None:
    """Why the tests above use ticks: window_of and the boundaries agree on them."""
    for window_ms in WINDOWS[1:]:
        stream = Stream("sub-1", window_ms=window_ms, after=0)
        for ticks in range(BASE, BASE + 3 * TICKS, 7):
            ts = seconds(ticks)
            window = stream.window_of(ts)
            assert window == window_of(ticks, window_ms)


# -- cursors on the wire ---------------------------------------------------------------


@given(st.text("0123456789abcdef", min_size=1, max_size=12), st.integers(0, 2**62))
def test_cursor_round_trip(tag: str, position: int) -> None:
    cursor = format_cursor(tag, position)
    assert parse_cursor(cursor, tag) == (position, None)


def test_cursor_of_a_tag_with_dashes_round_trips() -> None:
    assert parse_cursor(format_cursor("a-b-c", 7), "a-b-c") == (7, None)


def test_foreign_cursors_are_refused() -> None:
    position, reason = parse_cursor(format_cursor("0123456789ab", 5), "ba9876543210")
    assert position is None
    assert reason is not None and "another Field" in reason


@pytest.mark.parametrize(
    "cursor", ["", "abc", "abc-", "-", "abc-x", "abc-1x", "abc- 1", "abc-+1", "abc--1", "abc-1.5"]
)
def test_garbage_cursors_are_refused(cursor: str) -> None:
    position, reason = parse_cursor(cursor, "abc")
    assert position is None
    assert isinstance(reason, str) and reason


@pytest.mark.parametrize("cursor", ["abc-" + "1" * 5000, "x" * 65, "abc-" + "9" * 61])
def test_a_cursor_past_the_longest_is_refused_and_quoted_cut_short(cursor: str) -> None:
    position, reason = parse_cursor(cursor, "abc")
    assert position is None
    assert reason is not None and cursor[:MAX_CURSOR_CHARS] in reason
    assert cursor[: MAX_CURSOR_CHARS + 1] not in reason and len(reason) < 2 * MAX_CURSOR_CHARS


def test_a_superscript_digit_cursor_is_refused_not_raised() -> None:
    position, reason = parse_cursor("abc-²", "abc")
    assert position is None and reason


def test_a_non_ascii_digit_cursor_is_refused() -> None:
    position, reason = parse_cursor("abc-\u0663", "abc")
    assert position is None and reason
