"""Read an engine's /metrics with prometheus_client's parser, whatever spelling it used.

Engines use colons in names (`llamacpp:`, `sglang:`). SGLang served through a
negotiated OpenMetrics response escapes the colon to `_` in sample lines only
(prometheus/client_python#1177), and OpenMetrics counters drop `_total` from the
TYPE line. We therefore index *samples* by name, mapping `<prefix>_` back to
`<prefix>:`, and ignore family boundaries.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def _base_name(name: str) -> str:
    """Family name of a sample name: histogram/counter suffixes removed."""
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


class Exposition:
    """Samples of one /metrics answer, indexed by normalized sample name."""

    def __init__(self, samples: dict[str, list[Sample]]):
        self.samples = samples

    def __contains__(self, name: str) -> bool:
        return name in self.samples

    def names(self) -> set[str]:
        return set(self.samples)

    def get(self, name: str, **match: str) -> list[Sample]:
        """Samples called `name` whose labels include `match`."""
        return [
            s
            for s in self.samples.get(name, [])
            if all(s.labels.get(k) == v for k, v in match.items())
        ]

    def sum(self, name: str, **match: str) -> float | None:
        """Sum of matching finite samples, or None when there is none (absent, not zero)."""
        values = [s.value for s in self.get(name, **match) if not math.isnan(s.value)]
        return sum(values) if values else None

    def max(self, name: str, **match: str) -> float | None:
        values = [s.value for s in self.get(name, **match) if not math.isnan(s.value)]
        return max(values) if values else None

    def first(self, name: str, **match: str) -> float | None:
        values = [s.value for s in self.get(name, **match) if not math.isnan(s.value)]
        return values[0] if values else None


def _sample_name(line: str) -> str:
    """The metric name a sample line starts with (quoted UTF-8 names are left whole)."""
    return line.split("{", 1)[0].split(" ", 1)[0]


def parse_exposition(text: str, prefix: str, families: Iterable[str] | None = None) -> Exposition:
    """Parse text (0.0.4 or OpenMetrics) and normalize `<prefix>_x` sample names to `<prefix>:x`.

    With `families` (names without the prefix), only the sample lines of those families are
    handed to the parser: SGLang's busy exposition has ~600 samples of which a collector needs
    a fifth, and parsing dominates the scrape. The first sample line is always parsed so that
    a body that is no exposition at all is still rejected. Raises ValueError for such a body.
    """
    if "\x00" in text:
        raise ValueError("binary data where a metrics exposition was expected")
    escaped = prefix.rstrip(":") + "_"
    if families is not None:
        keep = {prefix + f for f in families} | {escaped + f for f in families}
        lines = [line for line in text.splitlines() if line and not line.startswith("#")]
        selected = [
            line for i, line in enumerate(lines) if i == 0 or _base_name(_sample_name(line)) in keep
        ]
        text = "\n".join(selected) + "\n"
    out: dict[str, list[Sample]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name.startswith(escaped):
                name = prefix + name[len(escaped) :]
            out[name].append(Sample(dict(sample.labels), float(sample.value)))
    return Exposition(dict(out))
