"""The bounded outbox of a push connection, on its own."""

from __future__ import annotations

import asyncio

import pytest

from field.engine.outbox import Outbox, Waker
from field.engine.router import Frame


def frame(n: int, size: int = 10) -> Frame:
    return Frame(b"x" * size, "notification", cursor=f"t-{n}")


async def test_frames_come_out_in_order_and_an_idle_outbox_holds_no_queue() -> None:
    outbox = Outbox(max_frames=10, max_bytes=1000)
    for n in range(3):
        assert outbox.put(frame(n))
    assert [(await outbox.get()).cursor for _ in range(3)] == ["t-0", "t-1", "t-2"]  # type: ignore[union-attr]
    waiting = asyncio.create_task(outbox.get())
    await asyncio.sleep(0)  # let it start waiting: nothing is queued
    assert outbox._frames is None and not waiting.done()
    outbox.put(frame(3))
    assert (await waiting) is not None and len(outbox) == 0


async def test_a_bound_passed_overflows_and_refuses_everything_after() -> None:
    outbox = Outbox(max_frames=2, max_bytes=1000)
    assert outbox.put(frame(0)) and outbox.put(frame(1))
    assert not outbox.put(frame(2))
    assert outbox.overflowed and len(outbox) == 2
    await outbox.get()
    assert not outbox.put(frame(3))  # overflow is final
    by_bytes = Outbox(max_frames=100, max_bytes=25)
    assert by_bytes.put(frame(0)) and by_bytes.put(frame(1))
    assert not by_bytes.put(frame(2, size=6)) and by_bytes.overflowed


async def test_close_with_queues_a_last_frame_past_the_bounds_then_ends() -> None:
    outbox = Outbox(max_frames=1, max_bytes=1000)
    outbox.put(frame(0))
    outbox.put(frame(1))  # overflows
    outbox.close_with(Frame(b"bye", "overflow"))
    outbox.close_with(Frame(b"again", "overflow"))  # closed already: ignored
    assert [(await outbox.get()), (await outbox.get())][1].kind == "overflow"  # type: ignore[union-attr]
    assert await outbox.get() is None
    assert not outbox.put(frame(2))


async def test_a_waiting_consumer_is_released_by_close() -> None:
    outbox = Outbox(max_frames=5, max_bytes=1000)
    waiting = asyncio.create_task(outbox.get())
    await asyncio.sleep(0)
    outbox.close_with(None)
    assert await waiting is None


async def test_wait_for_room_paces_a_producer_at_half_full() -> None:
    outbox = Outbox(max_frames=4, max_bytes=1000)
    outbox.put(frame(0))
    await outbox.wait_for_room()  # 1 of 4: room
    outbox.put(frame(1))
    paced = asyncio.create_task(outbox.wait_for_room())
    await asyncio.sleep(0)
    assert not paced.done()  # 2 of 4: not under half
    await outbox.get()
    await paced
    assert outbox.room() == 3
    outbox.put(frame(2))
    closing = asyncio.create_task(outbox.wait_for_room())
    await asyncio.sleep(0)
    outbox.close_with(None)
    await closing  # closing releases pacers too


def test_drain_now_takes_at_most_the_limit() -> None:
    outbox = Outbox(max_frames=10, max_bytes=1000)
    for n in range(5):
        outbox.put(frame(n))
    assert [f.cursor for f in outbox.drain_now(3)] == ["t-0", "t-1", "t-2"]
    assert outbox._frames is not None  # two still wait
    assert len(outbox) == 2 and len(outbox.drain_now(10)) == 2 and outbox.drain_now(1) == []
    assert outbox._frames is None  # drained: an idle outbox holds no queue
    assert outbox.put(frame(5)) and len(outbox) == 1


async def test_an_outbox_holds_no_list_of_pacers_unless_one_waits() -> None:
    outbox = Outbox(max_frames=2, max_bytes=1000)
    assert outbox._pacers is None
    outbox.put(frame(0))
    paced = asyncio.create_task(outbox.wait_for_room())
    await asyncio.sleep(0)
    assert outbox._pacers is not None and not paced.done()
    await outbox.get()
    await paced
    assert outbox._pacers is None


# -- the waker: consumers woken a few per turn after a fan-out -------------------------------


async def _consumers(outboxes: list[Outbox]) -> tuple[list[asyncio.Task[Frame | None]], list[int]]:
    """A consumer task per outbox, each waiting in get(); and the order they woke in."""
    woke: list[int] = []

    async def consume(i: int, outbox: Outbox) -> Frame | None:
        got = await outbox.get()
        woke.append(i)
        return got

    tasks = [asyncio.create_task(consume(i, o)) for i, o in enumerate(outboxes)]
    await asyncio.sleep(0)  # every consumer waits
    return tasks, woke


async def test_uncorked_a_waker_wakes_a_consumer_at_once() -> None:
    waker = Waker(per_turn=1)
    outbox = Outbox(max_frames=10, max_bytes=1000, waker=waker)
    (task,), woke = await _consumers([outbox])
    outbox.put(frame(0))
    await asyncio.sleep(0)
    assert woke == [0] and waker.due == 0


async def test_corked_consumers_wake_after_the_fan_out_a_few_per_turn_with_all_frames() -> None:
    waker = Waker(per_turn=2)
    outboxes = [Outbox(max_frames=10, max_bytes=1000, waker=waker) for _ in range(5)]
    tasks, woke = await _consumers(outboxes)
    waker.cork()
    for n in range(3):
        for outbox in reversed(outboxes):  # noted in the order they first got a frame
            outbox.put(frame(n))
    await asyncio.sleep(0)
    assert woke == [] and waker.due == 5  # each outbox noted once
    waker.uncork()
    done = []
    for _ in range(3):
        await asyncio.sleep(0)
        done.append(list(woke))
    assert done == [[4, 3], [4, 3, 2, 1], [4, 3, 2, 1, 0]]
    assert waker.due == 0
    for task, outbox in zip(tasks, outboxes, strict=True):
        assert (await task) is not None
        assert len(outbox.drain_now(10)) == 2  # the rest of the batch is there for one write


async def test_a_cork_during_the_waking_goes_on_with_what_was_due_and_holds_the_new() -> None:
    waker = Waker(per_turn=1)
    outboxes = [Outbox(max_frames=10, max_bytes=1000, waker=waker) for _ in range(5)]
    _, woke = await _consumers(outboxes)
    waker.cork()
    waker.cork()  # nested
    for outbox in outboxes[:3]:
        outbox.put(frame(0))
    waker.uncork()
    await asyncio.sleep(0)
    assert woke == []  # still corked once
    waker.uncork()
    await asyncio.sleep(0)
    assert woke == [0]  # and the next one is woken: its turn comes next
    waker.cork()  # the next fan-out begins
    outboxes[4].put(frame(1))
    outboxes[3].put(frame(1))
    for _ in range(4):
        await asyncio.sleep(0)
    assert woke == [0, 1, 2]  # the last fan-out's consumers do not wait for this one
    assert waker.due == 2
    waker.uncork()
    for _ in range(2):
        await asyncio.sleep(0)
    assert woke == [0, 1, 2, 4, 3]


def test_an_uncork_without_a_cork_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        Waker().uncork()
    with pytest.raises(ValueError):
        Waker(per_turn=0)
