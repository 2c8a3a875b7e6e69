"""One collector per source behind one small async interface.

A collector reads one source (NVML, one llama-server, one SGLang server) and
returns a `Scrape`: fresh metric families, whether the source is up, and the
errors it met, each classified by reason. The runner (`exporter.runner`) calls
every collector concurrently under the scrape deadline and adds the per-source
`llmb_source_*` metrics; a collector never has to know about the others.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client.metrics_core import Metric

ErrorReason = Literal["timeout", "connect", "http", "parse"]
REASONS: tuple[ErrorReason, ...] = ("timeout", "connect", "http", "parse")


class SourceError(Exception):
    """A source could not be read; `reason` is one of REASONS."""

    def __init__(self, reason: ErrorReason, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class Scrape:
    """What one collector produced in one scrape."""

    metrics: list[Metric] = field(default_factory=list)
    up: bool = True
    errors: list[SourceError] = field(default_factory=list)


class Collector(abc.ABC):
    """Reads one source. `source` names it in `llmb_source_*{source=...}`."""

    source: str

    @abc.abstractmethod
    async def collect(self) -> Scrape:
        """Read the source once and return fresh families. Must not raise for source failures
        it can classify; the runner treats any other exception as a parse error."""

    def fallback(self) -> list[Metric]:
        """Families to emit when `collect` timed out or crashed (e.g. `llmb_engine_up 0`)."""
        return []

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Start background work (samplers, log followers). Called once by the runner."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Stop background work and release resources."""
