"""An engine's result built once from what its run gathered (`diagnose.decision.built`).

The roofline and the prefill figures are not written by the steps: they follow from the
engine's facts and its rows, so the result cannot hold a figure its rows contradict.
"""

from __future__ import annotations

from dataclasses import replace

from diagnose.decision.built import engine_result
from diagnose.decision.model import Facts, Prefill, Row
from diagnose.decision.prefill import row_prefill
from diagnose.decision.roofline import roofline

GIB = 2**30
FACTS = Facts(
    "e",
    "llamacpp",
    weights_bytes=4 * GIB,
    kv_bytes_per_token=2048.0,
    bandwidth_bytes_per_s=1e12,
    bandwidth_source="exporter",
    slots=4,
    prefill=Prefill(peak_flops=989.5e12, peak_source="table", matmul_flops=8e9),
)


def _row(step: str, concurrency: int, prompt: float, decode: float, prefill: float) -> Row:
    return Row("e", step, concurrency, prompt_tokens=prompt, max_tokens=64,
               per_seq_tok_s=decode, prefill_tok_s=prefill, requests=concurrency)  # fmt: skip


def test_the_roofline_and_prefill_follow_from_the_facts_and_rows() -> None:
    single = _row("single", 1, 512.0, 93.0, 20000.0)
    busy = _row("concurrency", 4, 2048.0, 60.0, 50000.0)
    res = engine_result(FACTS, [single, busy], notes=["n"])
    # The single-request row against the card's limit, as every reader computes it.
    assert res.roofline == roofline(res) and res.roofline.measured_tok_s == 93.0
    assert res.roofline.efficiency is not None and 0 < res.roofline.efficiency < 1
    # The prefill of the step that stands for the engine (one at a time), on the facts' peak.
    assert res.prefill == row_prefill(FACTS, single)
    assert (res.prefill.measured_tok_s, res.prefill.peak_flops) == (20000.0, 989.5e12)
    assert FACTS.prefill.measured_tok_s is None  # the facts are a value: left as they were
    assert (res.slots, res.bandwidth_source, res.notes) == (4, "exporter", ["n"])
    assert res.rows == [single, busy]


def test_a_failed_row_gives_no_figure() -> None:
    failed = replace(_row("single", 1, 512.0, 93.0, 20000.0), error="engine gone")
    res = engine_result(FACTS, [failed])
    assert res.roofline.measured_tok_s is None and res.prefill.measured_tok_s is None
    assert res.prefill.peak_flops == 989.5e12  # the limit's inputs stay known
