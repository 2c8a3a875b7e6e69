"""--find-max judges the row it just measured (a review's case).

`--concurrency 8,16,24 --slo e2e_p50=1s`: c=8 meets, c=16 cannot be judged (its requests
straddle 1 s), c=24 misses. The bisection measures c=16 again with the requests a judgement
needs, every one well within: that probe decides c=16 and the search goes on above it. It used
to read the first c=16 row again ("cannot judge") and stop at c=8.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from core.slo import parse_slo
from diagnose.decision.model import EngineResult, Row
from diagnose.find_max import find_max
from diagnose.steps.base import LoadStep
from diagnose.switch_noise import _record


class Levels:
    """An engine whose rows are written with their requests (requests.jsonl), as measured."""

    def __init__(self, out: Path) -> None:
        self.out, self.result = out, EngineResult("eng", "llamacpp")
        self.lines: list[str] = []
        self.probes: list[int] = []

    def add(self, concurrency: int, e2es: list[float]) -> Row:
        step = len(self.result.rows)
        records = []
        for i, e2e in enumerate(e2es):
            r = _record("eng", i, 1000.0 * step + i * 0.01, 100.0)
            r.step, r.e2e_s, r.end_time = step, e2e, r.start_time + e2e
            records.append(r)
        self.lines += [r.to_json() for r in records]
        (self.out / "requests.jsonl").write_text("\n".join(self.lines) + "\n")
        row = Row("eng", "concurrency", concurrency, requests=len(records),
                  completion_tokens=128 * len(records), tokens_ok=True, aggregate_tok_s=100.0,
                  aggregate_rounds=[100.0], record_steps=[step])  # fmt: skip
        self.result.rows.append(row)
        return row

    async def load_row(self, load: LoadStep) -> Row:
        self.probes.append(load.concurrency)
        assert load.requests is not None
        return self.add(load.concurrency, [0.8] * (load.requests * load.rounds))


def test_a_level_measured_again_is_judged_by_its_new_probe(tmp_path: Path) -> None:
    levels = Levels(tmp_path)
    rng = random.Random(0)
    levels.add(8, [0.5] * 16)
    levels.add(16, [rng.uniform(0.6, 1.4) for _ in range(32)])
    levels.add(24, [2.0] * 48)
    said: list[str] = []
    run: Any = SimpleNamespace(
        view=lambda: levels.result,
        out=tmp_path,
        opts=SimpleNamespace(requests_per_slot=2, rounds=1, prompt_tokens=32),
        phase=lambda *a, **k: contextlib.nullcontext(),
        load_row=levels.load_row,
        say=lambda step, text: said.append(text),
    )
    answer = asyncio.run(find_max(run, parse_slo("e2e_p50=1s")))
    assert levels.probes[0] == 16 and said[0] == "find-max c=16: within e2e_p50=1s"
    assert levels.probes[1] > 16
    assert answer.startswith("highest load within e2e_p50=1s: c=23 (c=24 misses it")
    # Of two rows at one level, the one with more requests (the later of equals) stands.
    at16 = levels.result.at_concurrency(16)
    assert at16 is not None and at16.record_steps == [3]
