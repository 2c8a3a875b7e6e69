"""A step's evidence for the verdict: the decision core's `Signals` at the step's end.

The signals come from the exporter's samples of the step's window through the recording
rules' arithmetic (`core.rules.rule_values_at`, via the monitor), completed with what only the
client saw (KV errors, the MoE batch). Where the exporter gave no sample of a step (an
`--exporter-url` that did not answer) or no GPU bandwidth for the roofline (no GPU here;
`--bandwidth-gbs` names it), diagnose writes what it measured as the exporter's series (same
names, labels and units: layers, weight buffers, process memory, running/waiting against the
slots, KV-pressure, generation and decode counters, the model's structure, the GPU's
bandwidth: `residency_values`, `step_values`) and feeds them through the same rules. No
condition input is computed a second way, and the verdict is always
`core.conditions.evaluate`'s.
"""

from __future__ import annotations

import time
from dataclasses import replace

from core import series as llmb
from core.card import card_sentence, shortfall_explained
from core.conditions import evaluate
from core.promql import series_from_scrapes
from core.roofline import decode_efficiency, roofline_tokens_per_second
from core.rules import RuleValues, rule_values_at
from core.signals import Signals
from core.thresholds import threshold_seconds
from diagnose.decision.model import Row
from diagnose.decision.prefill import row_prefill
from diagnose.decision.roofline import bytes_per_step, row_batch
from diagnose.engine_run import EngineRun
from diagnose.monitor import RESULT_STRUCTURE_SERIES
from loadgen.exporter_series import Series, first

# How far the rules' prefill tok/s may stray from the requests' before diagnose says so.
PREFILL_AGREE = 0.10


def step_evidence(run: EngineRun, row: Row, t0: float, t1: float) -> Row:
    """The step's signals and verdict (appended to `run.step_verdicts`), and `row` with what
    they add to it (the rules' prefill figure, the SM clock, the queue and KV seen)."""
    mon = run.monitor
    values = mon.rule_values(t1, since=t0)
    if values is not None:
        # The step's prompts against the limit at the SM clock it ran at, as the rules take
        # it: one prefill efficiency for the verdict, the report and Prometheus.
        row = replace(
            row,
            rules_prefill_tok_s=values.prefill_tokens_per_second,
            sm_clock_ratio=values.signals.sm_clock_ratio,
        )
        if row.prefill_tok_s is not None:
            row = replace(row, prefill_efficiency=row_prefill(run.facts, row).efficiency)
        sig = complete(run, values.signals, row, t1, values)
        kv = mon.window(llmb.ENGINE_KV_CACHE_USAGE_RATIO, t0, t1)
        waiting = mon.window(llmb.ENGINE_REQUESTS_WAITING, t0, t1)
        row = replace(
            row,
            kv_usage_max=max(kv) if kv else None,
            waiting_avg=sum(waiting) / len(waiting) if waiting else None,
        )
    else:
        # No exporter sample of the step: the samples it would have given, through the rules.
        sig = step_values(run, row, t1).signals
        row = replace(row, waiting_avg=sig.waiting_avg)
    verdict = evaluate(sig)
    run.step_verdicts.append((row.step, verdict.name, sig))
    return row


def _moe_batch_efficiency(
    run: EngineRun, sig: Signals, row: Row, values: RuleValues | None
) -> Signals:
    """A mixture-of-experts step's decode efficiency at the batch the step kept running."""
    model = run.facts.structure()
    batch = float(row_batch(run.facts, row))
    moe = model is not None and model.experts_known and bool(model.routed_expert_bytes)
    if not (
        values is not None
        and moe
        and values.decode_batch is not None
        and values.decode_batch < batch
        and values.decode_tokens_per_second is not None
        and values.bandwidth_bytes_per_second is not None
    ):
        return sig
    # A short step's edges dilute the running average the rules take as the batch;
    # an MoE step's bytes grow with it, so use the sequences the step kept running.
    kv_tokens = None
    if row.prompt_tokens is not None:
        kv_tokens = batch * (row.prompt_tokens + row.max_tokens / 2)
    per_step, _ = bytes_per_step(run.facts, kv_tokens, batch)
    roof = roofline_tokens_per_second(
        values.bandwidth_bytes_per_second, per_step, run.facts.spec_accept_length
    )
    run.note(
        f"{row.step}: the mixture-of-experts roofline uses the {batch:.0f} sequences the step kept "
        f"running (the rules' running average over the step gave {values.decode_batch:.0f})"
    )
    return replace(sig, decode_efficiency=decode_efficiency(values.decode_tokens_per_second, roof))


def complete(
    run: EngineRun, sig: Signals, row: Row, t1: float, values: RuleValues | None = None
) -> Signals:
    """Add what the client measured and the rules cannot see, and say so."""
    sig = _moe_batch_efficiency(run, sig, row, values)
    client_kv = row.kv_exhausted + row.truncated
    if client_kv and not (sig.kv_pressure_increase or 0) > 0:
        sig = replace(sig, kv_pressure_increase=float(client_kv))
        run.note(
            f"{row.step}: {client_kv} requests ran out of KV/context on the client side "
            "that the exporter did not count (no engine log?); counted as KV pressure"
        )
    sig = _own_prefill(run, sig, row)
    if sig.decode_efficiency is None and run.opts.bandwidth_bytes_per_s:
        own = step_values(run, row, t1).signals.decode_efficiency
        if own is not None:
            sig = replace(sig, decode_efficiency=own)
            run.note(
                "decode efficiency uses --bandwidth-gbs: no GPU bandwidth series for the "
                "rules (the Prometheus verdict cannot see it)"
            )
    # The share of the gap the lost clock explains follows the efficiencies used here; the
    # prefill's counts only with long prompts (the rules' mean prompt, else the step's).
    prompt = sig.prompt_tokens_mean if sig.prompt_tokens_mean is not None else row.prompt_tokens
    explained = shortfall_explained(
        sig.sm_clock_ratio,
        sig.decode_efficiency,
        sig.prefill_efficiency,
        sig.memory_clock_ratio,
        prompt,
    )
    return replace(sig, card_shortfall_explained=explained)


def card_evidence(run: EngineRun, sig: Signals) -> str | None:
    """What the card did under load (`core.card.card_sentence`), beside the verdict: the
    answer and the report show it as the engine's evidence (None: nothing to say)."""
    watts = first(run.monitor.latest(), llmb.GPU_POWER_LIMIT_WATTS)
    return card_sentence(sig, watts)


# Diagnose's own readings as the exporter's samples ------------------------------------

HOST = "diagnose"
GPU = "0"
# EngineResult field -> the exporter's series of the model's size and structure.
STRUCTURE = {
    **llmb.field_series("weights_bytes", "kv_bytes_per_token"),
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
    res, page = run.facts, _Page(run)
    page.put(llmb.ENGINE_UP, 1.0)
    if res.layers_total:
        page.put(llmb.ENGINE_GPU_LAYERS_OFFLOADED, res.layers_offloaded or 0.0)
        page.put(llmb.ENGINE_GPU_LAYERS_TOTAL, res.layers_total)
    for attr, name in STRUCTURE.items():
        page.put(name, getattr(res, attr))
    page.put(llmb.ENGINE_SLOTS, res.slots)
    if run.monitor.source == "gpu":
        page.gpu(llmb.GPU_MEMORY_TOTAL_BYTES, res.gpu_total_bytes or 0.0)
        page.put(llmb.ENGINE_MODEL_BUFFER_BYTES, res.gpu_buffer_bytes, device="GPU")
        page.put(llmb.ENGINE_PROCESS_GPU_MEMORY_BYTES, res.process_gpu_bytes)
    if res.bandwidth_bytes_per_s:
        page.gpu(llmb.GPU_MEMORY_BANDWIDTH_BYTES_PER_SECOND, res.bandwidth_bytes_per_s)
        # The engine's processes hold this GPU (the rules attribute bandwidth that way).
        page.gpu(
            llmb.GPU_PROCESS_MEMORY_USED_BYTES,
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
    slots = run.facts.slots
    batch = row_batch(run.facts, row)
    tokens = float(row.completion_tokens)
    span = max(1.0, min(row.wall_s or 1.0, threshold_seconds("rate_window") / 2))
    scrapes = []
    for t, rose in ((t1 - span, False), (t1, True)):
        page = _engine_page(run)
        page.put(llmb.ENGINE_REQUESTS_RUNNING, float(batch))
        if slots:
            page.put(llmb.ENGINE_REQUESTS_WAITING, float(max(0, row.concurrency - slots)))
        if row.prompt_tokens is not None:
            kv = batch * (row.prompt_tokens + row.max_tokens / 2)
            page.put(llmb.ENGINE_KV_CACHE_USED_TOKENS, kv)
        events = row.kv_exhausted + max(row.truncated, row.kv_events)
        page.put(llmb.ENGINE_KV_PRESSURE_EVENTS_TOTAL, events if rose else 0.0, event="client")
        page.put(llmb.ENGINE_GENERATION_TOKENS_TOTAL, tokens if rose else 0.0)
        if row.per_seq_tok_s:
            # Per-sequence decode: the rules' decode rate is tokens over their decode time.
            page.put(llmb.ENGINE_DECODE_TOKENS_TOTAL, tokens if rose else 0.0)
            seconds = tokens / row.per_seq_tok_s
            page.put(llmb.ENGINE_DECODE_SECONDS_TOTAL, seconds if rose else 0.0)
        scrapes.append((t, page.series))
    return _values(run, scrapes, t1)


def _own_prefill(run: EngineRun, sig: Signals, row: Row) -> Signals:
    """The step's prefill efficiency from the engine's own prompt timings of the step's
    requests where it has them: the same figure as the rules' (`core.prefill`: prompt tokens
    computed over the time prefill ran), over exactly the step's prompts rather than the
    rate window, and the one the report shows."""
    rules, own = row.rules_prefill_tok_s, row.prefill_tok_s
    if rules and own and abs(rules - own) > PREFILL_AGREE * own:
        run.note(
            f"{row.step}: prefill {own:.0f} tok/s from the requests' prompt timings, "
            f"{rules:.0f} tok/s from the exporter's series over the step (the engine's log "
            "and counters): they should agree"
        )
    if row.prefill_efficiency is None:
        return sig
    if sig.prefill_efficiency is None:
        source = run.facts.prefill.peak_source or "the peak given"
        run.note(
            f"{row.step}: prefill efficiency from the engine's prompt timings and {source} "
            "(no peak-compute series for the rules: the Prometheus verdict cannot see it)"
        )
    return replace(sig, prefill_efficiency=row.prefill_efficiency)
