"""Garbage collection paced around the reads while a phase measures."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Iterator

# While a phase measures, the cyclic garbage collector runs only at these intervals (a young
# collection, about a millisecond): a full collection in the middle of a phase stalls the
# event loop for several milliseconds and lands in the inter-token gaps of every stream.
GC_INTERVAL_S = 5.0
# A due collection waits for quiet reads (see phase.QUIET_S), but at most this long.
GC_MAX_DELAY_S = 1.0


@contextlib.contextmanager
def quiet_gc(enabled: bool, quiet: Callable[[], float] | None = None) -> Iterator[None]:
    """Freeze what exists, pause automatic collections, collect young objects on a timer.

    `quiet()` (seconds until the reads are quiet, 0 when they are) delays a due
    collection into a gap between reads, by at most GC_MAX_DELAY_S.
    """
    if not enabled or not gc.isenabled():
        yield
        return
    gc.collect()
    gc.freeze()
    gc.disable()
    loop = asyncio.get_running_loop()
    handle: asyncio.TimerHandle | None = None
    due = 0.0

    def young() -> None:
        nonlocal handle, due
        now = time.perf_counter()
        wait = quiet() if quiet is not None else 0.0
        if wait > 0 and now - due < GC_MAX_DELAY_S:
            handle = loop.call_later(wait, young)
            return
        gc.collect(1)
        due = time.perf_counter() + GC_INTERVAL_S
        handle = loop.call_later(GC_INTERVAL_S, young)

    due = time.perf_counter() + GC_INTERVAL_S
    handle = loop.call_later(GC_INTERVAL_S, young)
    try:
        yield
    finally:
        handle.cancel()
        gc.enable()
        gc.unfreeze()
