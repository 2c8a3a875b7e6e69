"""Replaying a traffic (`--traffic`): on its schedule, or as fast as the concurrency allows.

On the schedule (open loop) every request goes out at its own time, `time_scale` times its
offset from the phase start, whatever the answers do: nothing waits for an answer but the
next turn of a session, sent `think_s` after the answer to the one before (and not before its
own offset). A send that cannot keep its time (the in-flight cap is full, the loop was busy)
goes out late, and the record keeps how late: the schedule is never shifted to hide it.
Without the schedule, `concurrency` workers take the requests in order, a session's turns
one after another by one worker, each later turn `think_s` after the answer to the one before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from loadgen.scheduler.inflight import InFlight
from loadgen.traffic.model import Traffic

# The schedule's clock starts this long after the replay does, so the first sends are not
# late by the time it takes to set the replay up.
START_LEAD_S = 0.02


@dataclass
class Sender:
    """What the replay needs of its phase: send one request, may it still send, and the
    schedule it records (`due[index]`, perf_counter)."""

    send: Callable[[int], Awaitable[None]]
    may_send: Callable[[], bool]
    sent_to: Callable[[int], None]
    due: dict[int, float]


def _units(traffic: Traffic) -> list[list[int]]:
    """The request indexes in send order: a single request, or a session's turns."""
    firsts: dict[int, list[int]] = {}
    in_session: set[int] = set()
    for indexes in traffic.sessions().values():
        firsts[indexes[0]] = indexes
        in_session.update(indexes)
    out = []
    for index in range(len(traffic.requests)):
        if index in firsts:
            out.append(firsts[index])
        elif index not in in_session:
            out.append([index])
    out.sort(key=lambda unit: traffic.requests[unit[0]].at_s)
    return out


async def _sleep_until(when: float) -> None:
    # Until the time has come: uvloop's timers count whole milliseconds and may wake up to one
    # early, so the last millisecond yields to the loop instead of sleeping (a send before its
    # time is as wrong as a late one). No event to wait for: the condition is the clock itself.
    while (delay := when - time.perf_counter()) > 0:  # noqa: ASYNC110
        await asyncio.sleep(delay if delay > 1e-3 else 0)


async def replay_scheduled(
    traffic: Traffic, sender: Sender, scale: float, cap_size: int, start: float | None = None
) -> None:
    """Send every request of `traffic` at its time (see the module's docstring)."""
    t0 = (start if start is not None else time.perf_counter()) + START_LEAD_S
    flight = InFlight(cap_size)

    async def session(indexes: list[int]) -> None:
        for turn, index in enumerate(indexes):
            req = traffic.requests[index]
            due = t0 + req.at_s * scale
            if turn:
                due = max(due, time.perf_counter() + req.think_s * scale)
                await _sleep_until(due)
                if not sender.may_send():
                    return
                await flight.slot()
            sender.due[index] = due
            sender.sent_to(index)
            await flight.send(sender.send, index)

    async def launches() -> None:
        for unit in _units(traffic):
            first = unit[0]
            await _sleep_until(t0 + traffic.requests[first].at_s * scale)
            if not sender.may_send():
                break
            # At the cap the send waits, and goes out late (counted), never silently shifted.
            await flight.slot()
            if len(unit) == 1:
                sender.due[first] = t0 + traffic.requests[first].at_s * scale
                sender.sent_to(first)
                flight.start(flight.send(sender.send, first))
            else:
                flight.start(session(unit))

    await flight.run(launches())


async def replay_closed(traffic: Traffic, sender: Sender, workers: int, scale: float = 1.0) -> None:
    """`workers` at a time, in the traffic's order; a session's turns one after another,
    each later turn `think_s` (x `scale`) after the answer to the one before."""
    units = iter(_units(traffic))

    async def worker() -> None:
        for unit in units:
            for turn, index in enumerate(unit):
                think = traffic.requests[index].think_s * scale
                if turn and think > 0:
                    # The user reads the answer before the next turn: the worker waits too.
                    await _sleep_until(time.perf_counter() + think)
                if not sender.may_send():
                    return
                sender.sent_to(index)
                await sender.send(index)

    await asyncio.gather(*(worker() for _ in range(max(1, workers))))
