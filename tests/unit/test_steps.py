"""Each step of the diagnose procedure on its own, on hand-made inputs.

A step takes typed inputs (the options and facts it reads, a fake "measure one load step"
returning made-up rows and verdicts, fake restarts) and returns a frozen `StepOutcome`; the
tests assert the outcome: the loads it asked for, its answer, whether it is flagged, its
numbers, the rows it made or completed and what it records as missing. In process, no
engine, no scheduler. The procedure's applying of an outcome is checked at the end.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from config.settings import parse_config
from core.signals import Signals
from core.slo import parse_slo
from diagnose.decision.model import Facts, Prefill, Roofline, Row, Step
from diagnose.options import Options
from diagnose.phase_marks import PhasePublisher
from diagnose.procedure import Diagnoser
from diagnose.steps.base import LoadStep, Measured, StepOutcome, StepStopped
from diagnose.steps.concurrency import (
    ConcurrencyInputs,
    ConcurrencySeams,
    Probed,
    concurrency_outcome,
)
from diagnose.steps.context import ContextInputs, ContextSeams, LaunchFigures, context_outcome
from diagnose.steps.kv import KvInputs, kv_outcome
from diagnose.steps.residency import residency_outcome
from diagnose.steps.single import SingleFigures, single_outcome
from loadgen.client import TargetUnreachable
from loadgen.traffic.model import Traffic, TrafficRequest
from tests.paths import ROOT

GIB = 2.0**30


def run(coro: Coroutine[Any, Any, StepOutcome]) -> StepOutcome:
    return asyncio.run(coro)


class FakeLoads:
    """A measuring seam: each load step answers the next made-up row (and its verdicts);
    the loads asked for are kept, and each row gets the next index of a pretend result."""

    def __init__(self, *answers: Row | tuple[Row, tuple[str, ...]] | Exception):
        self.answers = list(answers)
        self.asked: list[tuple[LoadStep, str]] = []

    async def __call__(self, load: LoadStep, note: str = "") -> Measured:
        self.asked.append((load, note))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        row, verdicts = answer if isinstance(answer, tuple) else (answer, ())
        return Measured(row, 100 + len(self.asked), verdicts)


class Said(list[str]):
    def __call__(self, text: str) -> None:
        self.append(text)


def ok_row(step: str, concurrency: int, **figures: Any) -> Row:
    return Row("e", step, concurrency, requests=concurrency, **figures)


# residency --------------------------------------------------------------------------------

FIGURES = Facts(
    "e",
    "llamacpp",
    layers_offloaded=20,
    layers_total=33,
    weights_bytes=4 * GIB,
    process_gpu_bytes=3 * GIB,
)


def test_residency_flags_layers_left_on_the_host() -> None:
    said = Said()
    sig = Signals(host_has_gpu=True, layers_ratio=20 / 33)
    out = residency_outcome(FIGURES, sig, said)
    assert out.step.key == "residency" and out.step.decisive
    assert out.step.answer.startswith("no: layers below the threshold; layers 0.61: ")
    assert (
        "(layers 20/33, weights 4.00 GiB, GPU weight buffers ?, process GPU memory 3.00 GiB)"
        in (out.step.answer)
    )
    assert out.step.numbers["layers_ratio"] == pytest.approx(20 / 33)
    assert out.step.numbers["host_has_gpu"] is True
    assert said == [out.step.answer] and out.missing == () and out.rows == ()


def test_residency_all_resident_and_not_measured() -> None:
    full = Signals(host_has_gpu=True, layers_ratio=1.0)
    out = residency_outcome(FIGURES, full, Said())
    assert out.step.answer.startswith("yes, from layers 1.00: ") and not out.step.decisive
    # A GPU but no ratio: not measured, with the input that is missing.
    out = residency_outcome(Facts("e", "llamacpp"), Signals(host_has_gpu=True), Said())
    assert not out.step.measured
    assert out.missing[0].startswith("residency: the weight size is not known")
    # No GPU at all: the weights are in host memory, the signals kept as numbers.
    out = residency_outcome(FIGURES, Signals(layers_ratio=0.0), Said())
    assert "no GPU seen" in out.step.answer and out.step.numbers["layers_ratio"] == 0.0
    assert out.missing[0].startswith("residency: no GPU seen")


# single -------------------------------------------------------------------------------------


def test_single_measures_one_request_against_the_roofline() -> None:
    roof = Roofline(
        bandwidth_bytes_per_s=1e12, bytes_per_step=5 * GIB, limit_tok_s=186.3, efficiency=0.5
    )
    loads = FakeLoads(ok_row("single", 1, per_seq_tok_s=93.1, per_seq_rounds=[93.0, 93.2]))
    said = Said()
    out = run(single_outcome(loads, lambda: SingleFigures(roof, Prefill()), 512, 2, said))
    assert loads.asked == [(LoadStep("single", 1, 512, 2), "")]
    assert out.step.answer.startswith("93.1 tok/s per sequence (10.7 ms/token), 50 % of")
    assert "prefill: not measured" in out.step.answer and not out.step.decisive
    assert out.step.numbers["efficiency"] == 0.5 and said == [out.step.answer]
    assert out.step.numbers["per_seq_tok_s"] == 93.1
    assert out.step.numbers["rounds"] == [93.0, 93.2]
    assert out.step.numbers["roofline_tok_s"] == 186.3


def test_single_failed_and_without_bandwidth() -> None:
    failed = ok_row("single", 1, error="1/1 requests failed: http_500 1")
    out = run(
        single_outcome(
            FakeLoads(failed), lambda: SingleFigures(Roofline(), Prefill()), 8, 1, Said()
        )
    )
    assert out.step.answer == "failed: 1/1 requests failed: http_500 1"
    no_bw = ok_row("single", 1, per_seq_tok_s=10.0)
    out = run(
        single_outcome(FakeLoads(no_bw), lambda: SingleFigures(Roofline(), Prefill()), 8, 1, Said())
    )
    assert "roofline unknown: pass --bandwidth-gbs" in out.step.answer


# concurrency ------------------------------------------------------------------------------


def _seams(loads: FakeLoads, probed: Probed | None = None) -> ConcurrencySeams:
    async def find_max(slo: Any) -> Probed:
        assert probed is not None
        return probed

    return ConcurrencySeams(loads, find_max, lambda row: f" [roofline c={row.concurrency}]", Said())


def test_concurrency_measures_each_level_and_sees_a_queue() -> None:
    single = ok_row("single", 1, per_seq_tok_s=50.0)
    loads = FakeLoads(
        (ok_row("concurrency", 2, aggregate_tok_s=90.0, ttft_s=0.2), ("decode_below_card_limit",)),
        (ok_row("concurrency", 4, aggregate_tok_s=100.0, waiting_avg=2.0), ("scheduling_bound",)),
    )
    inputs = ConcurrencyInputs((1, 2, 4), 256, 1, slots=2, single=single)
    out = run(concurrency_outcome(_seams(loads), inputs))
    assert [(a.concurrency, a.prompt_tokens, n) for a, n in loads.asked] == [
        (2, 256, "concurrency 2"),
        (4, 256, "concurrency 4"),
    ]
    assert out.step.answer.startswith(
        "c=2: 90.0 tok/s aggregate (x1.80 of one sequence), TTFT p50 0.200 s [roofline c=2]; "
        "c=4: 100.0 tok/s aggregate (x2.00 of one sequence)"
    )
    assert ", 2.0 waiting on average [roofline c=4]" in out.step.answer
    assert out.step.answer.endswith("; requests queue for a slot (2 slots)")
    assert out.step.decisive


def test_concurrency_failed_level_find_max_and_nothing_to_measure() -> None:
    loads = FakeLoads(ok_row("concurrency", 2, error="2/2 requests failed: timeout 2"))
    slo = parse_slo("ttft_p99=2s")
    probed = Probed("the highest load within the SLO: c=3", ("scheduling_bound",))
    inputs = ConcurrencyInputs((2,), 256, 1, find_max_slo=slo)
    out = run(concurrency_outcome(_seams(loads, probed), inputs))
    # The probe's queue counts as the step's: flagged, and the probe's line is the answer's.
    assert out.step.answer == (
        "c=2 failed (2/2 requests failed: timeout 2); the highest load within the SLO: c=3; "
        "requests queue for a slot"
    )
    assert out.step.decisive
    out = run(concurrency_outcome(_seams(FakeLoads()), ConcurrencyInputs((1,), 256, 1)))
    assert out.missing == ("concurrency: no --concurrency above 1",) and not out.step.measured


def test_concurrency_replays_the_traffic_at_its_width() -> None:
    traffic = Traffic("mix.yaml", (TrafficRequest(0.0, 100, 10, ((0, 100),)),))
    row = ok_row("concurrency", 3, aggregate_tok_s=30.0, prompt_cache_hit_ratio=0.42,
                 tokens_ok=True, tokens_off=0)  # fmt: skip
    loads = FakeLoads((row, ("idle",)))
    inputs = ConcurrencyInputs((1, 8), 256, 2, traffic=traffic, traffic_width=3)
    out = run(concurrency_outcome(_seams(loads), inputs))
    assert loads.asked == [(LoadStep("concurrency", 3, 0, 2, traffic=traffic), "traffic mix.yaml")]
    assert out.step.answer.startswith("your traffic, c=3: 30.0 tok/s aggregate")
    assert "prefix cache 42% of prompt tokens (engine counters)" in out.step.answer
    assert out.step.numbers["prompt_cache_hit_ratio"] == 0.42 and not out.step.decisive


# kv pressure ------------------------------------------------------------------------------


def test_kv_fills_every_slot_with_half_a_slot_context() -> None:
    row = ok_row("kv_pressure", 4, truncated=1, kv_events=2, kv_usage_max=0.97)
    loads = FakeLoads((row, ("kv_saturated",)))
    said = Said()
    inputs = KvInputs(None, 32, (1, 2, 8), slots=4, slot_context=4096)
    out = run(kv_outcome(loads, inputs, said))
    tokens = 2048 - 16
    assert loads.asked == [
        (LoadStep("kv_pressure", 4, tokens, requests=4), f"4 x {tokens} prompt tokens")
    ]
    assert out.step.decisive and out.step.answer.endswith("; the KV cache is full")
    assert "KV usage up to 97 %" in out.step.answer and said == [out.step.answer]
    assert out.step.numbers == {
        "prompt_tokens": tokens, "concurrency": 4, "truncated": 1, "kv_exhausted": 0,
        "kv_events": 2, "kv_usage_max": 0.97,
    }  # fmt: skip


def test_kv_skipped_or_without_a_slot_context() -> None:
    out = run(kv_outcome(FakeLoads(), KvInputs(0, 32, (1,), None, 4096), Said()))
    assert out.missing == ("kv_pressure: skipped (--kv-prompt-tokens 0)",)
    out = run(kv_outcome(FakeLoads(), KvInputs(None, 32, (1,), None, None), Said()))
    assert out.missing == (
        "kv_pressure: the context per slot is unknown (pass --kv-prompt-tokens)",
    )


# context ------------------------------------------------------------------------------------


class FakeRestarts:
    """Launches that start except at `fails`; the KV bytes grow with the context."""

    def __init__(self, fails: tuple[int, ...] = ()):
        self.fails = fails
        self.ctx = 0
        self.events: list[str] = []

    async def launch(self, ctx: int) -> bool:
        self.events.append(f"launch {ctx}")
        self.ctx = ctx
        return ctx not in self.fails

    async def settle(self) -> float | None:
        return 2 * GIB + self.ctx * 1024.0

    def stop(self) -> None:
        self.events.append("stop")

    def load_seconds(self) -> float | None:
        return 3.0

    def kv_bytes(self) -> float | None:
        return self.ctx * 1024.0

    def memory_is_gpu(self) -> bool:
        return True


def _context_inputs(**given: Any) -> ContextInputs:
    base = ContextInputs(
        engine="e", launchable=True, has_ctx=True, contexts=None, max_context=None,
        trained_context=32768, slot_context=None, launched_ctx=8192, prompt_tokens=64,
        parallel=1, gpu_total_bytes=24 * GIB,
    )  # fmt: skip
    return dataclasses.replace(base, **given)


def _context_seams(restarts: FakeRestarts, loads: FakeLoads) -> ContextSeams:
    return ContextSeams(restarts, loads, lambda row: Prefill(), Said())


def test_context_sweep_doubles_until_the_card_is_near_full() -> None:
    restarts = FakeRestarts()
    loads = FakeLoads(
        ok_row("context", 1, context=16384, memory_bytes=10 * GIB),
        ok_row("context", 1, context=32768, memory_bytes=24 * GIB - 1),  # no headroom left
    )
    out = run(context_outcome(_context_seams(restarts, loads), _context_inputs(), LaunchFigures()))
    assert [a.context for a, _ in loads.asked] == [16384, 32768]
    assert restarts.events == ["stop", "launch 16384", "stop", "launch 32768", "stop"]
    (i1, first), (i2, second) = out.amended
    assert (i1, i2) == (101, 102)
    assert first.error is None and first.loaded_memory_bytes == 2 * GIB + 16384 * 1024.0
    assert first.kv_bytes == 16384 * 1024.0 and first.load_seconds == 3.0
    assert second.error is not None and second.error.startswith("GPU memory near full")
    assert out.step.answer == "memory gives out at 32768 tokens (largest context loaded: 16384)"
    assert out.step.decisive and out.step.numbers["tried"] == [16384, 32768]
    assert out.leading == () and out.rows == () and out.stopped is None


def test_context_given_contexts_keep_the_first_launch_and_a_dead_engine() -> None:
    single = ok_row("single", 1, per_seq_tok_s=40.0, aggregate_rounds=[40.0])
    first = LaunchFigures(single, loaded_memory=5 * GIB, load_seconds=2.5, kv_bytes=GIB)
    loads = FakeLoads(TargetUnreachable("connection refused"))
    inputs = _context_inputs(contexts=(4096, 8192))
    out = run(context_outcome(_context_seams(FakeRestarts(), loads), inputs, first))
    (launch_row,) = out.leading
    assert (launch_row.step, launch_row.context, launch_row.aggregate_rounds) == (
        "context",
        4096,
        [],
    )
    assert launch_row.loaded_memory_bytes == 5 * GIB and launch_row.kv_bytes == GIB
    (dead,) = out.rows
    assert (dead.context, dead.error, dead.parallel) == (8192, "connection refused", 1)
    assert out.step.answer == "memory gives out at 8192 tokens (largest context loaded: 4096)"


def test_context_launch_fails_nothing_to_sweep_and_interrupted() -> None:
    seams = _context_seams(FakeRestarts(fails=(16384,)), FakeLoads())
    out = run(context_outcome(seams, _context_inputs(), LaunchFigures()))
    assert out.step.answer.startswith("memory gives out at 16384 tokens")
    seams = _context_seams(FakeRestarts(), FakeLoads())
    out = run(context_outcome(seams, _context_inputs(launchable=False), LaunchFigures()))
    assert out.missing == (
        "context: the engine was already running (no launch template to restart it)",
    )
    loads = FakeLoads(
        ok_row("context", 1, context=16384, memory_bytes=GIB),
        StepStopped("interrupted: stopped by a signal", True),
    )
    out = run(
        context_outcome(_context_seams(FakeRestarts(), loads), _context_inputs(), LaunchFigures())
    )
    assert out.stopped is not None and out.stopped.interrupted
    assert [r.context for _, r in out.amended] == [16384]  # what finished is kept


# the procedure applies an outcome -----------------------------------------------------------


def test_the_procedure_takes_an_outcome_in_and_builds_the_result_from_it(tmp_path: Path) -> None:
    cfg = parse_config(
        {"engines": [{"name": "e", "kind": "llamacpp", "url": "http://x:1"}]}, environ={}
    )
    d = Diagnoser(cfg.engines[0], Options(), tmp_path, PhasePublisher())
    before, measured = ok_row("single", 1), ok_row("context", 1, context=8192)
    d.rows += [before, measured]
    completed = dataclasses.replace(measured, kv_bytes=GIB)
    lead, dead = ok_row("context", 1, context=4096), ok_row("context", 1, context=16384, error="x")
    step = Step("context", "?", "answer", True)
    outcome = StepOutcome(
        step, rows=(dead,), amended=((1, completed),), missing=("context: why",), leading=(lead,)
    )
    d.apply(outcome, start=1)
    assert d.rows == [before, lead, completed, dead]
    assert d.missing == ["context: why"] and d.steps["context"] is step
    # The result is built from what the run gathered, at the end.
    res = d.result()
    assert res.rows == [before, lead, completed, dead] and res.rows is not d.rows
    assert res.missing[0] == "context: why"


def test_no_step_takes_the_engine_run() -> None:
    """The steps see values and seams only: no `EngineRun`, no import of the run's module."""
    for path in sorted((ROOT / "diagnose" / "steps").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "EngineRun" not in names and "diagnose.engine_run" not in imported, path.name
        assert "EngineResult" not in names or path.name == "residency.py", path.name
