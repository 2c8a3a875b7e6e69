"""Read an engine's /metrics, whatever spelling it used, with a narrow and fast line reader.

Engines use colons in names (`llamacpp:`, `sglang:`). SGLang served through a
negotiated OpenMetrics response escapes the colon to `_` in sample lines only
(prometheus/client_python#1177), and OpenMetrics counters drop `_total` from the
TYPE line. We therefore index *samples* by name, mapping `<prefix>_` back to
`<prefix>:`, and ignore family boundaries (TYPE/HELP lines are skipped).

Why our own reader: prometheus_client's parser is pure Python, character by character,
and dominated the exporter's scrape time with a busy SGLang (~600 samples). This reader
only reads sample lines (`name{labels} value [timestamp] [# exemplar]`, also with a quoted
UTF-8 name) with compiled regular expressions, and only those of the families a collector
maps. A malformed line costs only itself (it is listed in `Exposition.problems`). A
hypothesis test checks it against prometheus_client's parser on the real fixtures and their
mutations (tests/unit/test_fuzz_promtext.py); bench/promtext_parse.py measures both.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

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

    def __init__(self, samples: dict[str, list[Sample]], problems: list[str] | None = None):
        self.samples = samples
        # Sample lines of read families that could not be parsed (each costs only itself).
        self.problems: list[str] = problems if problems is not None else []

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


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_QUOTED = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
_LABEL = rf"[ \t]*([a-zA-Z_][a-zA-Z0-9_]*|{_QUOTED})[ \t]*=[ \t]*({_QUOTED})[ \t]*"
_LABEL_RE = re.compile(_LABEL)
_LABEL_NC = rf"[ \t]*(?:[a-zA-Z_][a-zA-Z0-9_]*|{_QUOTED})[ \t]*=[ \t]*{_QUOTED}[ \t]*"
# A whole label block: labels separated by commas, an optional trailing comma.
_LABELS = rf"(?:{_LABEL_NC}(?:,{_LABEL_NC})*,?)?[ \t]*"
# Go's ParseFloat spellings that Prometheus writes; no underscores, no Python-only forms.
_VALUE_RE = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[Ii]nf|NaN|nan)")
_SAMPLE_RE = re.compile(
    rf"(?:({_NAME})(?:\{{({_LABELS})\}})?|\{{[ \t]*({_QUOTED})[ \t]*(?:,({_LABELS}))?\}})"
    rf"[ \t]+(\S+)(?:[ \t]+(\S+))?[ \t]*(?: # .*)?"
)
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r"\\(.)")


def _unquote(text: str) -> str:
    """A quoted label value or name without quotes, escapes resolved as Prometheus does."""
    inner = text[1:-1]
    if "\\" not in inner:
        return inner
    return _ESCAPE_RE.sub(lambda m: _ESCAPES.get(m.group(0), m.group(0)), inner)


def _labels(block: str | None) -> dict[str, str]:
    """Labels of a `{...}` block that the sample pattern has already validated."""
    if not block:
        return {}
    labels: dict[str, str] = {}
    for match in _LABEL_RE.finditer(block):
        name = match.group(1)
        labels[_unquote(name) if name.startswith('"') else name] = _unquote(match.group(2))
    return labels


def parse_sample_line(line: str) -> tuple[str, dict[str, str], float] | None:
    """(name, labels, value) of one sample line, or None when it is not a valid sample."""
    match = _SAMPLE_RE.fullmatch(line)
    if match is None:
        return None
    name, block, quoted, rest, value, timestamp = match.groups()
    if quoted is not None:
        name, block = _unquote(quoted), rest
    labels = _labels(block)
    if _VALUE_RE.fullmatch(value) is None:
        return None
    if timestamp is not None and _VALUE_RE.fullmatch(timestamp) is None:
        return None
    return name, labels, float(value)


def _line_name(line: str) -> str:
    """The metric name a sample line starts with, cheaply (quoted UTF-8 names unquoted)."""
    if line.startswith('{"'):
        end = line.find('"', 2)
        return line[2:end] if end > 0 else ""
    end = len(line)
    for sep in ("{", " ", "\t"):
        found = line.find(sep, 0, end)
        if found >= 0:
            end = found
    return line[:end]


class ParseBudgetExceeded(ValueError):
    """The exposition took longer to read than the caller allowed."""


def parse_exposition(
    text: str,
    prefix: str,
    families: Iterable[str] | None = None,
    budget_seconds: float | None = None,
) -> Exposition:
    """Parse text (0.0.4 or OpenMetrics) and normalize `<prefix>_x` sample names to `<prefix>:x`.

    With `families` (names without the prefix), only the sample lines of those families are
    parsed: SGLang's busy exposition has ~600 samples of which a collector needs a fifth.
    The first sample line is always parsed, so that a body that is no exposition at all is
    rejected with ValueError; any later malformed line only lands in `problems`.

    With `budget_seconds`, reading stops with ParseBudgetExceeded once that much time has
    passed: a parse in a worker thread cannot be cancelled, so it bounds itself.
    """
    if "\x00" in text:
        raise ValueError("binary data where a metrics exposition was expected")
    escaped = prefix.rstrip(":") + "_"
    out: dict[str, list[Sample]] = defaultdict(list)
    problems: list[str] = []
    stop_at = None if budget_seconds is None else time.perf_counter() + budget_seconds
    lines: Iterable[str]
    if families is None:
        lines = text.split("\n")
        keep = None
    else:
        families = tuple(families)
        keep = {prefix + f for f in families} | {escaped + f for f in families}
        first = _first_sample_line(text)
        if first is None:
            return Exposition({}, problems)
        # The regular expression finds the mapped families' lines in C; Python only sees those.
        found = (m.group(0) for m in _family_lines(prefix, families).finditer(text))
        lines = itertools.chain((first,), found)
    is_first = True
    for count, raw in enumerate(lines):
        if stop_at is not None and count % 4096 == 4095 and time.perf_counter() > stop_at:
            raise ParseBudgetExceeded(f"not read within {budget_seconds:.2f}s")
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parsed = parse_sample_line(line)
        if parsed is None:
            if is_first:
                raise ValueError(f"not a metrics exposition: {line[:80]!r}")
            problems.append(f"bad sample line: {line[:80]!r}")
            continue
        name, labels, value = parsed
        if is_first:
            is_first = False
            if keep is not None:
                continue  # only checked: the family lines below include it when mapped
        if name.startswith(escaped):
            name = prefix + name[len(escaped) :]
        out[name].append(Sample(labels, value))
    return Exposition(dict(out), problems)


def _first_sample_line(text: str) -> str | None:
    """The first line that is neither empty nor a comment."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        line = text[start:end].strip()
        if line and not line.startswith("#"):
            return line
        start = end + 1
    return None


@functools.lru_cache(maxsize=16)
def _family_lines(prefix: str, families: tuple[str, ...]) -> re.Pattern[str]:
    """Lines whose metric name is `<prefix>family` or `<prefix with _>family`, plus suffixes."""
    base = re.escape(prefix.rstrip(":"))
    names = "|".join(re.escape(f) for f in sorted(families, key=len, reverse=True))
    name = rf"{base}[:_](?:{names})(?:_bucket|_sum|_count|_total|_created)?"
    return re.compile(rf'^[ \t]*(?:{name}(?=[{{ \t])|\{{[ \t]*"{name}").*$', re.MULTILINE)
