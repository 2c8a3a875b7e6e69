"""The requests behind each row: requests.jsonl read back and matched to the rows it measured.

Every comparison's interval comes from these per-request samples (`core.stats`). A row
names the `step` numbers of its rounds (`Row.record_steps`); runs saved before that field are
matched by order: the engine's rows in order take its steps in order, a row taking as many
steps as it has rounds when their request counts add up to the row's (a row that reuses
another's requests, like the context sweep's first context, takes none).
"""

from __future__ import annotations

import lzma
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import orjson

from diagnose.decision.model import EngineResult, Row
from diagnose.decision.sources import figure
from loadgen.results import RequestRecord

REQUESTS_FILE = "requests.jsonl"

_FIELDS = {f.name for f in fields(RequestRecord)}

Rounds = list[list[RequestRecord]]


def read_requests(text: bytes) -> list[RequestRecord]:
    """Every record of a requests.jsonl's bytes (fields of newer versions are ignored)."""
    out = []
    for line in text.splitlines():
        if line.strip():
            data = orjson.loads(line)
            out.append(RequestRecord(**{k: v for k, v in data.items() if k in _FIELDS}))
    return out


def decode_rate(r: RequestRecord) -> tuple[float | None, str | None]:
    """Per-sequence decode tok/s of one request and its source (`diagnose.decision.sources`):
    the client's chunks when it saw two or more, else the engine's own figure."""
    if r.error is not None:
        return None, None
    rate = figure(r.decode_tok_s if r.chunks > 1 else None, r.server_predicted_per_second)
    return rate.value, rate.source


@dataclass
class EngineRequests:
    """One engine's requests, grouped per row and round."""

    engine: str
    by_row: dict[int, Rounds] = field(default_factory=dict)  # index into EngineResult.rows

    def rounds(self, engine: EngineResult, row: Row | None) -> Rounds:
        """The rounds of `row` (empty when its requests are unknown)."""
        if row is None:
            return []
        for i, r in enumerate(engine.rows):
            if r is row:
                return self.by_row.get(i, [])
        return []


def match_rows(engine: EngineResult, records: Iterable[RequestRecord]) -> EngineRequests:
    """Group `engine`'s records by step and give each row its rounds."""
    steps: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.engine == engine.name:
            steps[r.step].append(r)
    out = EngineRequests(engine.name)
    order = sorted(steps)
    pos = 0
    for i, row in enumerate(engine.rows):
        if row.record_steps:
            out.by_row[i] = [steps[s] for s in row.record_steps if steps.get(s)]
            continue
        n = max(1, len(row.aggregate_rounds))
        taken = order[pos : pos + n]
        if len(taken) == n and _count(steps, taken) in (row.requests, _total(row)):
            out.by_row[i] = [steps[s] for s in taken]
            pos += n
    return out


def _count(steps: dict[int, list[RequestRecord]], taken: Sequence[int]) -> int:
    return sum(len(steps[s]) for s in taken)


def _total(row: Row) -> int:
    return row.requests + row.requests_failed


def load_requests(folder: Path, engines: Sequence[EngineResult]) -> dict[str, EngineRequests]:
    """Each engine's requests from `folder/requests.jsonl`, or its xz-compressed copy
    `requests.jsonl.xz` (as saved runs are kept); empty when neither is there."""
    path = folder / REQUESTS_FILE
    packed = path.with_name(path.name + ".xz")
    if path.exists():
        records = read_requests(path.read_bytes())
    elif packed.exists():
        records = read_requests(lzma.decompress(packed.read_bytes()))
    else:
        records = []
    return {e.name: match_rows(e, records) for e in engines}
