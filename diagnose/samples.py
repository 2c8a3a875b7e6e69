"""The raw samples the exporter would have given, from diagnose's own readings.

When the exporter gave no sample of a step (an `--exporter-url` that did not answer) or no
GPU bandwidth for the roofline (no GPU here; `--bandwidth-gbs` names it), diagnose writes
what it measured as the exporter's series (same names, labels and units: layers, weight
buffers, process memory, running/waiting against the slots, KV-pressure, generation and
decode counters, the model's structure, the GPU's bandwidth) and feeds them through the
recording rules' arithmetic (`core.rules.rule_values_at`). No condition input is computed a
second way: the rules compute them all.
"""

from __future__ import annotations

import time

from core.rules import RuleValues, rule_values_at, series_from_scrapes
from core.thresholds import threshold_seconds
from diagnose.decision.model import Row
from diagnose.decision.roofline import row_batch
from diagnose.engine_run import EngineRun
from diagnose.facts import RESULT_STRUCTURE_SERIES
from loadgen.exporter_series import Series

HOST = "diagnose"
GPU = "0"
# EngineResult field -> the exporter's series of the model's size and structure.
STRUCTURE = {
    "weights_bytes": "llmb_model_weights_bytes",
    "kv_bytes_per_token": "llmb_model_kv_bytes_per_token_estimated",
    **RESULT_STRUCTURE_SERIES,
}


class _Page:
    """One scrape being written, the engine's labels at hand."""

    def __init__(self, run: EngineRun):
        self.engine = {"engine": run.monitor.exporter_engine, "host": HOST, "kind": run.engine.kind}
        self.series: Series = {}

    def put(self, name: str, value: float | None, **labels: str) -> None:
        if value is not None:
            lab = {**self.engine, **labels}
            self.series[(name, tuple(sorted(lab.items())))] = float(value)

    def gpu(self, name: str, value: float, **labels: str) -> None:
        lab = {"host": HOST, "gpu": GPU, **labels}
        self.series[(name, tuple(sorted(lab.items())))] = float(value)


def _engine_page(run: EngineRun) -> _Page:
    """The gauges of the engine at rest: up, layers, weights, buffers, memory, the card."""
    res, page = run.result, _Page(run)
    page.put("llmb_engine_up", 1.0)
    if res.layers_total:
        page.put("llmb_engine_gpu_layers_offloaded", res.layers_offloaded or 0.0)
        page.put("llmb_engine_gpu_layers_total", res.layers_total)
    for attr, name in STRUCTURE.items():
        page.put(name, getattr(res, attr))
    page.put("llmb_engine_slots", res.slots)
    if run.monitor.source == "gpu":
        page.gpu("llmb_gpu_memory_total_bytes", res.gpu_total_bytes or 0.0)
        page.put("llmb_engine_model_buffer_bytes", res.gpu_buffer_bytes, device="GPU")
        page.put("llmb_engine_process_gpu_memory_bytes", res.process_gpu_bytes)
    if res.bandwidth_bytes_per_s:
        page.gpu("llmb_gpu_memory_bandwidth_bytes_per_second", res.bandwidth_bytes_per_s)
        # The engine's processes hold this GPU (the rules attribute bandwidth that way).
        page.gpu(
            "llmb_gpu_process_memory_used_bytes",
            res.process_gpu_bytes or 1.0,
            engine=run.monitor.exporter_engine,
            pid="0",
        )
    return page


def _values(run: EngineRun, scrapes: list[tuple[float, Series]], at: float) -> RuleValues:
    series = series_from_scrapes(scrapes)
    (values,) = rule_values_at(series, at).values()
    return values


def residency_values(run: EngineRun) -> RuleValues:
    """The rules' values of the engine at rest, from diagnose's readings."""
    now = time.time()
    return _values(run, [(now, _engine_page(run).series)], now)


def step_values(run: EngineRun, row: Row, t1: float) -> RuleValues:
    """The rules' values at the end of a load step, from what the client measured.

    Two scrapes, at the step's start and end (within one rate window): the engine ran
    min(concurrency, slots) requests and the rest waited; the counters rose by the step's
    KV-pressure events, generated tokens and per-sequence decode time.
    """
    slots = run.result.slots
    batch = row_batch(run.result, row)
    tokens = float(row.completion_tokens)
    span = max(1.0, min(row.wall_s or 1.0, threshold_seconds("rate_window") / 2))
    scrapes = []
    for t, rose in ((t1 - span, False), (t1, True)):
        page = _engine_page(run)
        page.put("llmb_engine_requests_running", float(batch))
        if slots:
            page.put("llmb_engine_requests_waiting", float(max(0, row.concurrency - slots)))
        if row.prompt_tokens is not None:
            kv = batch * (row.prompt_tokens + row.max_tokens / 2)
            page.put("llmb_engine_kv_cache_used_tokens", kv)
        events = row.kv_exhausted + max(row.truncated, row.kv_events)
        page.put("llmb_engine_kv_pressure_events_total", events if rose else 0.0, event="client")
        page.put("llmb_engine_generation_tokens_total", tokens if rose else 0.0)
        if row.per_seq_tok_s:
            # Per-sequence decode: the rules' decode rate is tokens over their decode time.
            page.put("llmb_engine_decode_tokens_total", tokens if rose else 0.0)
            seconds = tokens / row.per_seq_tok_s
            page.put("llmb_engine_decode_seconds_total", seconds if rose else 0.0)
        scrapes.append((t, page.series))
    return _values(run, scrapes, t1)
