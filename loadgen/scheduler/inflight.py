"""The open loop's sends: each its own task, at most a cap of them in flight.

The arrival process (Poisson, or a traffic's schedule) and the replay both launch their
requests through this one loop: take a slot (at the cap the send waits, and goes out late),
start the send as a task that frees its slot when it ends, and on the way out (the phase
ends, is aborted or cancelled) cancel the sends still running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any


class InFlight:
    """The sends in flight, at most `size` at a time."""

    def __init__(self, size: int) -> None:
        self._cap = asyncio.Semaphore(size)
        self._tasks: set[asyncio.Task[None]] = set()

    async def slot(self) -> None:
        """Wait for a free slot (held until a `send` in it ends)."""
        await self._cap.acquire()

    async def send(self, send: Callable[[int], Awaitable[None]], index: int) -> None:
        """`send(index)` in a slot taken before; its end, however it ends, frees the slot."""
        try:
            await send(index)
        finally:
            self._cap.release()

    def start(self, body: Coroutine[Any, Any, None]) -> None:
        """Run `body` as its own task (kept until it ends, or `run` cancels it)."""
        task = asyncio.create_task(body)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run(self, launches: Awaitable[None]) -> None:
        """Await `launches` (which starts the sends), then every send; cancel the rest on
        the way out."""
        tasks = self._tasks
        try:
            await launches
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
