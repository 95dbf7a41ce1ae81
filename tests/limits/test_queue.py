"""The admission queue: slots, priority order, refusals (full, deadline unreachable), drops
(queue timeout), clients that leave, and the predicted wait, with a fake clock advanced by hand."""

from __future__ import annotations

import asyncio

import pytest

from tests.clock import ManualClock
from titan.config.admission import Priority
from titan.errors import OverloadedError
from titan.limits.queue import AdmissionQueue, Admitted

# A deadline far enough that no real wait_for timeout fires while a test runs.
FAR = 3_600.0


def make_queue(clock: ManualClock, capacity: int | None = 1, max_queue: int = 16) -> AdmissionQueue:
    return AdmissionQueue("m", capacity, max_queue, now=clock)


async def settle_loop() -> None:
    """Let scheduled callbacks and tasks run (a grant passes through a few loop iterations)."""
    for _ in range(10):
        await asyncio.sleep(0)


def enter(
    queue: AdmissionQueue, clock: ManualClock, priority: Priority = "normal"
) -> asyncio.Task[Admitted]:
    return asyncio.create_task(queue.enter(priority, clock.now + FAR))


async def next_done(tasks: set[asyncio.Task[Admitted]]) -> asyncio.Task[Admitted]:
    """The one task that completes next (a real timeout only guards against a hang)."""
    done, _ = await asyncio.wait(tasks, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1
    task = done.pop()
    tasks.discard(task)
    return task


async def measure(
    queue: AdmissionQueue, clock: ManualClock, service_s: float, times: int = 1
) -> None:
    """Requests that each hold a slot for ``service_s`` (the queue must be idle)."""
    for _ in range(times):
        admitted = await queue.enter("normal", clock.now + FAR)
        clock.now += service_s
        queue.leave(admitted)


# ---- slots -------------------------------------------------------------------------------------


async def test_second_request_waits_for_the_slot(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=1)
    first = await queue.enter("normal", clock.now + FAR)
    assert first.wait_s == 0.0
    assert queue.num_running == 1
    second = enter(queue, clock)
    await settle_loop()
    assert not second.done()
    assert queue.num_waiting == 1
    clock.now += 2.0
    queue.leave(first)
    admitted = await second
    assert admitted.wait_s == pytest.approx(2.0)
    assert admitted.started_at == clock.now
    assert queue.num_running == 1  # the slot passed straight on
    assert queue.num_waiting == 0
    queue.leave(admitted)
    assert queue.num_running == 0


async def test_leave_twice_frees_one_slot(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=2)
    a = await queue.enter("normal", clock.now + FAR)
    b = await queue.enter("normal", clock.now + FAR)
    queue.leave(a)
    queue.leave(a)
    assert queue.num_running == 1
    queue.leave(b)
    assert queue.num_running == 0


async def test_capacity_none_never_queues(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=None, max_queue=0)
    held = [await queue.enter("batch", clock.now + 1.0) for _ in range(100)]
    assert all(a.wait_s == 0.0 for a in held)
    assert queue.num_waiting == 0
    assert queue.predicted_wait_s("batch") == 0.0
    for admitted in held:
        queue.leave(admitted)
    assert queue.num_running == 0


# ---- order -------------------------------------------------------------------------------------


async def test_priority_order_then_fifo(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=1)
    running = await queue.enter("normal", clock.now + FAR)
    arrivals: list[tuple[str, Priority]] = [
        ("batch-1", "batch"),
        ("normal-1", "normal"),
        ("interactive-1", "interactive"),
        ("batch-2", "batch"),
        ("normal-2", "normal"),
        ("interactive-2", "interactive"),
    ]
    names: dict[asyncio.Task[Admitted], str] = {}
    for name, priority in arrivals:
        names[enter(queue, clock, priority)] = name
        await settle_loop()  # arrival order is the order of entering
    assert queue.num_waiting == 6
    pending = set(names)
    order = []
    holder = running
    for _ in arrivals:
        queue.leave(holder)
        task = await next_done(pending)
        order.append(names[task])
        holder = task.result()
        assert queue.num_running == 1
    queue.leave(holder)
    assert order == [
        "interactive-1",
        "interactive-2",
        "normal-1",
        "normal-2",
        "batch-1",
        "batch-2",
    ]
    assert queue.num_running == 0
    assert queue.num_waiting == 0


# ---- refusals ----------------------------------------------------------------------------------


async def test_full_queue_refuses_at_once(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=1, max_queue=2)
    running = await queue.enter("normal", clock.now + FAR)
    waiting = [enter(queue, clock), enter(queue, clock)]
    await settle_loop()
    assert queue.num_waiting == 2
    with pytest.raises(OverloadedError) as caught:
        await queue.enter("interactive", clock.now + FAR)
    error = caught.value
    assert error.status_code == 503
    assert error.code == "queue_full"
    assert error.retry_after is not None and error.retry_after >= 1.0
    assert queue.num_waiting == 2
    holder = running
    for task in waiting:
        queue.leave(holder)
        holder = await task
    queue.leave(holder)
    assert queue.num_running == 0


async def test_max_queue_zero_refuses_when_busy(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=1, max_queue=0)
    running = await queue.enter("normal", clock.now + FAR)
    with pytest.raises(OverloadedError) as caught:
        await queue.enter("normal", clock.now + FAR)
    assert caught.value.code == "queue_full"
    queue.leave(running)


async def test_full_queue_retry_after_follows_the_service_rate(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=2, max_queue=1)
    await measure(queue, clock, 4.0)
    running = [await queue.enter("normal", clock.now + FAR) for _ in range(2)]
    waiting = enter(queue, clock)
    await settle_loop()
    with pytest.raises(OverloadedError) as caught:
        await queue.enter("normal", clock.now + FAR)
    assert caught.value.retry_after == pytest.approx((1 + 1) * 4.0 / 2)
    queue.leave(running[0], measure=False)
    queue.leave(await waiting, measure=False)
    queue.leave(running[1], measure=False)
    assert queue.num_running == 0


# ---- predicted wait and deadlines --------------------------------------------------------------


async def test_predicted_wait_from_measured_service_time(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=2)
    assert queue.predicted_wait_s("normal") == 0.0  # idle
    await measure(queue, clock, 3.0, times=3)
    assert queue.service_time_s == pytest.approx(3.0)
    running = [await queue.enter("normal", clock.now + FAR) for _ in range(2)]
    assert queue.predicted_wait_s("normal") == pytest.approx(1 * 3.0 / 2)  # nobody ahead
    normal = [enter(queue, clock, "normal") for _ in range(3)]
    batch = [enter(queue, clock, "batch") for _ in range(2)]
    await settle_loop()
    assert queue.predicted_wait_s("normal") == pytest.approx((3 + 1) * 3.0 / 2)
    assert queue.predicted_wait_s("batch") == pytest.approx((5 + 1) * 3.0 / 2)
    assert queue.predicted_wait_s("interactive") == pytest.approx(1 * 3.0 / 2)
    # Drain, without measuring (the service time stays 3s).
    holders = list(running)
    pending = set(normal + batch)
    while holders:
        queue.leave(holders.pop(), measure=False)
        if pending:
            holders.append((await next_done(pending)).result())
    assert queue.num_running == 0
    assert queue.num_waiting == 0


async def test_service_time_is_an_ewma(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=1)
    assert queue.service_time_s is None
    await measure(queue, clock, 2.0)
    assert queue.service_time_s == pytest.approx(2.0)  # the first measure is taken as is
    await measure(queue, clock, 12.0)
    assert queue.service_time_s == pytest.approx(2.0 + 0.1 * (12.0 - 2.0))
    admitted = await queue.enter("normal", clock.now + FAR)
    clock.now += 100.0
    queue.leave(admitted, measure=False)
    assert queue.service_time_s == pytest.approx(3.0)


async def test_unreachable_deadline_is_refused_at_once(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=1)
    await measure(queue, clock, 2.0)
    running = await queue.enter("normal", clock.now + FAR)
    waiting = enter(queue, clock)
    await settle_loop()
    # One ahead: predicted wait (1 + 1) · 2 / 1 = 4s, then 2s of service: 6s in all.
    assert queue.predicted_wait_s("normal") == pytest.approx(4.0)
    with pytest.raises(OverloadedError) as caught:
        await queue.enter("normal", clock.now + 5.9)
    error = caught.value
    assert error.status_code == 503
    assert error.code == "deadline_unreachable"
    assert error.retry_after == pytest.approx(4.0)
    assert queue.num_waiting == 1  # the refused request never queued
    # An interactive request jumps the queue: 2s wait + 2s service fits 5s.
    jumper = asyncio.create_task(queue.enter("interactive", clock.now + 5.0))
    await settle_loop()
    assert queue.num_waiting == 2
    pending = {waiting, jumper}
    queue.leave(running, measure=False)
    first = await next_done(pending)
    assert first is jumper
    queue.leave(first.result(), measure=False)
    queue.leave(await waiting, measure=False)
    assert queue.num_running == 0


async def test_free_slot_admits_whatever_the_deadline(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=1)
    await measure(queue, clock, 10.0)
    admitted = await queue.enter("normal", clock.now + 1.0)
    assert admitted.wait_s == 0.0
    queue.leave(admitted)


async def test_queued_request_is_dropped_when_its_deadline_passes(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=1)
    running = await queue.enter("normal", clock.now + FAR)
    assert queue.service_time_s is None  # the real timeout is the whole deadline
    with pytest.raises(OverloadedError) as caught:
        await queue.enter("normal", clock.now + 0.05)
    error = caught.value
    assert error.status_code == 503
    assert error.code == "queue_timeout"
    assert error.retry_after is not None
    assert queue.num_waiting == 0  # no longer waiting
    assert queue.predicted_wait_s("normal") == 0.0  # nothing measured yet
    later = enter(queue, clock)
    await settle_loop()
    assert queue.num_waiting == 1
    queue.leave(running, measure=False)  # skips the dropped one, grants the later one
    admitted = await later
    assert queue.num_running == 1
    queue.leave(admitted, measure=False)
    assert queue.num_running == 0
    assert queue.num_waiting == 0


async def test_release_after_a_drop_frees_the_slot(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=1)
    running = await queue.enter("normal", clock.now + FAR)
    with pytest.raises(OverloadedError):
        await queue.enter("batch", clock.now + 0.05)
    queue.leave(running)
    assert queue.num_running == 0
    assert queue.num_waiting == 0
    admitted = await queue.enter("normal", clock.now + FAR)  # the fast path again
    assert admitted.wait_s == 0.0
    queue.leave(admitted)


# ---- clients that leave ------------------------------------------------------------------------


async def test_cancelled_waiter_is_removed(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=1)
    running = await queue.enter("normal", clock.now + FAR)
    gone = enter(queue, clock, "interactive")
    stays = enter(queue, clock, "normal")
    await settle_loop()
    assert queue.num_waiting == 2
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert queue.num_waiting == 1
    queue.leave(running, measure=False)  # skips the cancelled one
    admitted = await stays
    assert queue.num_running == 1
    queue.leave(admitted, measure=False)
    assert queue.num_running == 0
    assert queue.num_waiting == 0


async def test_cancelled_right_after_the_grant_passes_the_slot_on(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=1)
    running = await queue.enter("normal", clock.now + FAR)
    gone = enter(queue, clock)
    stays = enter(queue, clock)
    await settle_loop()
    gone.cancel()  # the client leaves...
    queue.leave(running, measure=False)  # ...in the instant the slot is handed to it
    with pytest.raises(asyncio.CancelledError):
        await gone
    admitted = await stays  # the slot passed on
    assert queue.num_running == 1
    assert queue.num_waiting == 0
    queue.leave(admitted, measure=False)
    assert queue.num_running == 0


async def test_cancelled_after_the_grant_with_nobody_waiting_frees_the_slot(
    clock: ManualClock,
) -> None:
    queue = make_queue(clock, capacity=1)
    running = await queue.enter("normal", clock.now + FAR)
    gone = enter(queue, clock)
    await settle_loop()
    gone.cancel()
    queue.leave(running, measure=False)
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert queue.num_running == 0  # no slot leaked
    assert queue.num_waiting == 0
    admitted = await queue.enter("normal", clock.now + FAR)
    assert admitted.wait_s == 0.0
    queue.leave(admitted)


def test_snapshot(clock: ManualClock) -> None:
    queue = make_queue(clock, capacity=3)
    assert queue.snapshot() == {
        "capacity": 3,
        "running": 0,
        "waiting": 0,
        "service_time_s": None,
    }
