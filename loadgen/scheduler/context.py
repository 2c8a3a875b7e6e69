"""What lives for a whole run: outputs, live metrics, progress, Ctrl-C flag, prompts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from loadgen.metrics import LoadgenMetrics
from loadgen.prompts import PromptSet
from loadgen.results import JsonlWriter, RequestRecord
from loadgen.scheduler.progress import Progress
from loadgen.summary import ServerFigures
from loadgen.target import Target
from loadgen.traffic.prompts import TrafficPrompts

# A step's prompts: the fixed prompt of a length, or a traffic's prompts per request.
Prompts = PromptSet | TrafficPrompts


class Probe(Protocol):
    """Samples server-side state (GPU memory, KV usage, queue) while one engine runs a step."""

    async def start(self) -> None: ...

    async def stop(self) -> ServerFigures: ...


ProbeFactory = Callable[[Target], Probe]


class RunContext:
    """State shared by the steps of one run."""

    def __init__(
        self,
        out_dir: Path | None,
        metrics: LoadgenMetrics | None = None,
        progress: Progress | None = None,
        probe_factory: ProbeFactory | None = None,
    ):
        self.out_dir = out_dir
        self.metrics = metrics
        self.progress = progress or Progress(enabled=False, interval=5.0)
        self.probe_factory = probe_factory
        self.writer = JsonlWriter(out_dir / "requests.jsonl") if out_dir else None
        self.stop = asyncio.Event()
        # (prompt_tokens, cache, endpoint) -> the calibrated set.
        self.prompts: dict[tuple[int | None, str, str], Prompts] = {}

    def record(self, record: RequestRecord) -> None:
        """Persist and publish one finished request."""
        self.record_many((record,))

    def record_many(self, records: Sequence[RequestRecord]) -> None:
        """Persist (one write and flush) and publish a batch of finished requests."""
        if self.writer is not None:
            self.writer.write_many(records)
        for record in records:
            if self.metrics is not None:
                self.metrics.observe(record)
            self.progress.update(record)

    def close(self) -> None:
        """Flush and close the outputs."""
        if self.writer is not None:
            self.writer.close()
