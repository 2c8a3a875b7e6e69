"""Progress on the terminal and the phase marks (`llmb_loadgen_phase_*`) for Grafana."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Gauge

from core import series as llmb
from diagnose.decision.model import PhaseMark


def say(text: str) -> None:
    """One progress line on the terminal (stderr, so stdout keeps only the answer)."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


class PhasePublisher:
    """Publishes the current phase as `llmb_loadgen_phase_info` plus its start timestamp."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.info = Gauge(
            llmb.LOADGEN_PHASE_INFO,
            "1 while the diagnose/compare phase runs, else 0.",
            ["engine", "phase"],
            registry=self.registry,
        )
        self.started = Gauge(
            llmb.LOADGEN_PHASE_START_TIMESTAMP_SECONDS,
            "Unix time the diagnose/compare phase last started.",
            ["engine", "phase"],
            registry=self.registry,
        )
        self.phases: list[tuple[str, PhaseMark]] = []

    @contextlib.contextmanager
    def mark(self, engine: str, name: str, note: str = "") -> Iterator[PhaseMark]:
        """Mark `name` as running for `engine` for the duration of the block."""
        ph = PhaseMark(name=name, start=time.time(), note=note)
        self.phases.append((engine, ph))
        self.info.labels(engine, name).set(1)
        self.started.labels(engine, name).set(ph.start)
        try:
            yield ph
        finally:
            ph.end = time.time()
            self.info.labels(engine, name).set(0)
