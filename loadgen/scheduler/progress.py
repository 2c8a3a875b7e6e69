"""Progress of one engine's step: a tqdm bar on a terminal, plain log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from loadgen.results import RequestRecord

log = logging.getLogger(__name__)


class Progress:
    """A tqdm bar with live tok/s and errors on a terminal, plain log lines otherwise."""

    def __init__(self, enabled: bool | None = None, interval: float = 5.0):
        self.tty = sys.stderr.isatty() if enabled is None else enabled
        self.interval = interval
        self._bar: Any = None
        self._t0 = 0.0
        self._last = 0.0
        self._label = ""
        self.done = self.errors = self.tokens = 0
        self.total: int | None = None

    def begin(self, label: str, total: int | None) -> None:
        """Start counting one engine's step."""
        self._label, self.total = label, total
        self.done = self.errors = self.tokens = 0
        self._t0 = self._last = time.perf_counter()
        if self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit="req", leave=True, dynamic_ncols=True)

    def update(self, record: RequestRecord) -> None:
        """Count one finished request."""
        self.done += 1
        self.tokens += record.completion_tokens or 0
        if record.error is not None:
            self.errors += 1
        now = time.perf_counter()
        rate = self.tokens / (now - self._t0) if now > self._t0 else 0.0
        if self._bar is not None:
            self._bar.update(1)
            if now - self._last > 0.25:
                self._bar.set_postfix(tok_s=f"{rate:.0f}", errors=self.errors, refresh=False)
                self._last = now
        elif now - self._last >= self.interval:
            self._last = now
            log.info(
                "%s: %d%s requests, %d errors, %.1f output tok/s",
                self._label,
                self.done,
                f"/{self.total}" if self.total else "",
                self.errors,
                rate,
            )

    def end(self) -> None:
        """Close the bar (or log the final line)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        else:
            elapsed = time.perf_counter() - self._t0
            log.info(
                "%s: finished %d requests, %d errors in %.1f s",
                self._label,
                self.done,
                self.errors,
                elapsed,
            )
