"""The report's tables: the facts of each engine and every measured step, each unknown value
saying how to get it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from config.kinds import engine_kind
from core.prefill import prefill_physical
from core.roofline import MISFIT_BY_NAME, host_bound_text, misfit_text
from diagnose.decision.model import EngineResult, Row
from diagnose.decision.sources import ENGINE, ENGINE_NOTE, source_note
from diagnose.report.hints import (
    FIX_BANDWIDTH,
    FIX_EXPORTER,
    FIX_LAUNCH,
    GIB,
    memory_why,
    roofline_unknown,
    unknown,
)


def _count(n: int) -> str:
    return str(n) if n else ""


def _pct_or_dash(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.0f} %"


def _fmt(value: float | str | None, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def gib(value: float | None) -> str:
    return "—" if value is None else f"{value / GIB:.2f}"


def _gib_or(value: float | None, why: str) -> str:
    return unknown(why) if value is None else f"{value / GIB:.2f} GiB"


def _layers(e: EngineResult) -> str:
    if e.layers_total is not None and e.layers_offloaded is not None:
        return f"{e.layers_offloaded:.0f} of {e.layers_total:.0f}"
    engine = engine_kind(e.kind)
    source = engine.residency
    if source.layers is None:
        return f"not reported by {engine.display} (compare process GPU memory with the weights)"
    log = e.evidence.get("log", "")
    if log and not log.startswith("not seen"):
        # The log was read and had no layer line (a build without a GPU backend prints none):
        # asking for --log-file again would be wrong.
        why = f"not in {source.layers} ({log})"
    else:
        why = f"{source.layers} was not read: {source.layers_fix} or pass --exporter-url"
    if e.layers_total is not None:
        return f"unknown of {e.layers_total:.0f}: {why}"
    return unknown(why)


def _decode_share(e: EngineResult) -> str:
    roof = e.roofline
    if not roof.measured_tok_s:
        return "not measured: no single-request step completed"
    single = e.single()
    speed = f"{roof.measured_tok_s:.1f} tok/s" + source_note(
        single.per_seq_source if single else None
    )
    if roof.efficiency is None:
        return f"{speed}; share of the card's limit unknown: {roofline_unknown(e)}"
    if roof.misfit is not None:
        # The physics gate: never a share above the limit, the reason instead.
        return f"{speed}: " + misfit_text(roof.efficiency, MISFIT_BY_NAME[roof.misfit])
    return f"{speed} = {roof.efficiency * 100:.0f} % of the card's limit"


def _bytes_per_step(e: EngineResult) -> str:
    roof = e.roofline
    if roof.bytes_per_step is None:
        return unknown("model weight size unknown: " + FIX_EXPORTER)
    text = f"{roof.bytes_per_step / 2**30:.2f} GiB"
    if roof.active_weights_bytes is not None:
        text += f" (weights {roof.active_weights_bytes / 2**30:.2f} GiB"
        if e.experts and e.experts_used:
            text += f", {e.experts_used:.0f} of {e.experts:.0f} experts per token"
        elif (model := e.structure()) is None or not model.structure_known:
            text += ", every weight counted: model structure unknown"
        if roof.kv_bytes_per_token:
            text += f"; KV {roof.kv_bytes_per_token / 1024:.0f} KiB per token"
        text += ")"
    return text


def _acceptance(e: EngineResult) -> str:
    if e.spec_accept_length is None:
        return "none seen (no speculative decoding reported)"
    return f"{e.spec_accept_length:.2f} tokens per model step"


def _expert_offload(e: EngineResult) -> str:
    if not e.experts_host_layers:
        return "none" if e.experts else "not a mixture-of-experts model (or unknown)"
    return (
        f"experts of {e.experts_host_layers:.0f} layers in host memory "
        f"({_gib_or(e.experts_host_bytes, FIX_EXPORTER)}); {host_bound_text(e.host_offload())}"
    )


def _bandwidth(e: EngineResult) -> str:
    bw = e.roofline.bandwidth_bytes_per_s or e.bandwidth_bytes_per_s
    if not bw:
        return unknown(FIX_BANDWIDTH)
    source = e.roofline.bandwidth_source or e.bandwidth_source
    return f"{bw / 1e9:.0f} GB/s" + (f" ({source})" if source else "")


def _slots(e: EngineResult) -> str:
    if e.slots is None:
        return unknown("the engine reported no slot count (llama.cpp /slots or /props)")
    ctx = f", {e.slot_context} tokens each" if e.slot_context else ""
    return f"{e.slots}{ctx}"


def engine_facts(e: EngineResult) -> list[tuple[str, str]]:
    """(fact, value) for one engine; every unknown value says how to get it."""
    limit = e.roofline.limit_tok_s
    return [
        ("kind", e.kind + (f" at {e.url}" if e.url else "")),
        ("model", e.model or unknown("the engine named no model in /v1/models")),
        ("quantization", e.quantization or unknown(FIX_EXPORTER)),
        ("weights", _gib_or(e.weights_bytes, FIX_EXPORTER)),
        ("process GPU memory", _gib_or(e.process_gpu_bytes, FIX_EXPORTER)),
        ("layers on the GPU", _layers(e)),
        ("slots", _slots(e)),
        (
            "trained context",
            f"{e.trained_context} tokens"
            if e.trained_context
            else unknown("the model's metadata was not read: " + FIX_EXPORTER),
        ),
        ("card memory", _gib_or(e.gpu_total_bytes, FIX_EXPORTER)),
        ("memory source", e.memory_source or unknown(memory_why([e]))),
        ("memory bandwidth", _bandwidth(e)),
        (
            "card's decode limit per sequence",
            f"{limit:.1f} tok/s" if limit else unknown(roofline_unknown(e)),
        ),
        ("bytes per decode step", _bytes_per_step(e)),
        ("speculative acceptance", _acceptance(e)),
        ("expert offload", _expert_offload(e)),
        ("single-request decode", _decode_share(e)),
        (
            "load time",
            f"{e.load_seconds:.2f} s"
            if e.load_seconds is not None
            else unknown("the engine was already running: " + FIX_LAUNCH),
        ),
    ]


def facts_table(engines: list[EngineResult]) -> tuple[tuple[str, ...], list[list[str]]]:
    """Facts down, engines across."""
    per_engine = [engine_facts(e) for e in engines]
    head = ("", *(e.name for e in engines))
    rows = [
        [name, *(facts[i][1] for facts in per_engine)] for i, (name, _) in enumerate(per_engine[0])
    ]
    return head, rows


def _prefill_share(efficiency: float | None) -> str:
    """A row's prompts as a share of the card's compute limit; never beyond physics (the
    decode column's gate, `core.prefill.prefill_physical`)."""
    if efficiency is not None and not prefill_physical(efficiency):
        return "does not fit (beyond physics)"
    return _pct_or_dash(efficiency)


def _share_of_limit(r: Row) -> str:
    """A row's per-sequence decode as a share of its limit; never beyond physics."""
    if r.efficiency is None:
        return "—"
    if r.misfit is not None:
        return f"does not fit ({r.misfit})"
    return f"{r.efficiency * 100:.0f} %"


# A cell from the engine's own timing (diagnose/decision/sources.py) says so; the table's
# note says what it means.
ENGINE_MARK = " (engine)"
ENGINE_CELLS = (
    f"(engine): {ENGINE_NOTE} (SGLang's histograms over the step, llama.cpp's per-request "
    "timings); an engine TTFT is the mean over the step's requests, the client's the p50"
)


def _sourced(value: float | None, source: str | None, digits: int = 1) -> str:
    """A figure, marked when it is the engine's own timing."""
    cell = _fmt(value, digits)
    return cell + ENGINE_MARK if value is not None and source == ENGINE else cell


@dataclass(frozen=True)
class Column:
    """One column of the measurement table and why it can be empty."""

    head: str
    cell: Callable[[Row], str]
    # Shown (as "not measured: ...") when the column is empty in every row and left out.
    empty_why: str = ""
    # Empty everywhere is the good case (no failures): left out without a note.
    quiet: bool = False


NO_PROMPT_TIMINGS = "the engine returned no prompt timings (llama.cpp does; SGLang does not)"
COLUMNS = (
    Column("engine", lambda r: r.engine),
    Column("step", lambda r: r.step),
    Column("ctx", lambda r: _fmt(r.context), "no row ran at a known context"),
    Column("slots", lambda r: _fmt(r.parallel), "no row recorded its slot count"),
    Column("conc", lambda r: str(r.concurrency)),
    # A request's prompt (the mean), but every request's answers together: said in the header.
    Column("prompt tok/req", lambda r: _fmt(r.prompt_tokens, 0), "no prompt token counts"),
    Column("gen tok, all req", lambda r: str(r.completion_tokens)),
    Column("tokens ok", lambda r: _fmt(r.tokens_ok)),
    Column(
        "TTFT ms",
        lambda r: _sourced(r.ttft_s * 1000 if r.ttft_s else None, r.ttft_source),
        "no tokens",
    ),
    Column(
        "TTFT p99 ms",
        lambda r: _fmt(r.ttft_p99_s * 1000 if r.ttft_p99_s is not None else None),
        "no step recorded a p99 TTFT",
    ),
    Column(
        "wait ms",
        lambda r: _fmt(r.queue_wait_s * 1000 if r.queue_wait_s is not None else None),
        NO_PROMPT_TIMINGS,
    ),
    Column(
        "prompt ms",
        lambda r: _fmt(r.prefill_s * 1000 if r.prefill_s is not None else None),
        NO_PROMPT_TIMINGS,
    ),
    Column("prefill tok/s", lambda r: _fmt(r.prefill_tok_s), NO_PROMPT_TIMINGS),
    Column(
        "of compute limit",
        lambda r: _prefill_share(r.prefill_efficiency),
        "no prefill compute limit (peak unknown: pass --peak-tflops)",
    ),
    Column("ms/token", lambda r: _sourced(r.per_token_ms, r.per_seq_source, 2), "no tokens"),
    Column(
        "server ms/token",
        lambda r: _fmt(r.server_per_token_ms, 2),
        "the engine returned no per-request timings (llama.cpp does; SGLang does not)",
    ),
    Column("per-seq tok/s", lambda r: _sourced(r.per_seq_tok_s, r.per_seq_source), "no tokens"),
    Column("aggregate tok/s", lambda r: _fmt(r.aggregate_tok_s), "no tokens"),
    Column("limit tok/s", lambda r: _fmt(r.limit_tok_s), "no roofline (bandwidth unknown)"),
    Column("of limit", lambda r: _share_of_limit(r), "no roofline (bandwidth unknown)"),
    Column(
        "spread",
        lambda r: _pct_or_dash(r.spread),
        "one round per step: pass --rounds 3 for the spread between rounds",
    ),
    Column(
        "prefix cache",
        lambda r: "" if r.prompt_cache_hit_ratio is None else f"{r.prompt_cache_hit_ratio:.0%}",
        quiet=True,
    ),
    Column("failed", lambda r: _count(r.requests_failed), quiet=True),
    Column("KV exhausted", lambda r: _count(r.kv_exhausted), quiet=True),
    Column("truncated", lambda r: _count(r.truncated), quiet=True),
    Column(
        "KV use max",
        lambda r: _pct_or_dash(r.kv_usage_max),
        "KV usage needs the engine's metrics: " + FIX_EXPORTER,
    ),
    Column(
        "waiting avg",
        lambda r: _fmt(r.waiting_avg),
        "queued requests need the engine's metrics: " + FIX_EXPORTER,
    ),
    Column("memory GiB", lambda r: gib(r.memory_bytes), "no memory source: " + FIX_EXPORTER),
    Column(
        "loaded GiB",
        lambda r: gib(r.loaded_memory_bytes),
        "memory after loading needs the tool to start the engine: " + FIX_LAUNCH,
    ),
    Column(
        "KV GiB",
        lambda r: gib(r.kv_bytes),
        "KV cache size needs a context sweep and the engine's log; or " + FIX_EXPORTER,
    ),
    Column(
        "load s",
        lambda r: _fmt(r.load_seconds, 2),
        "load time needs the tool to start the engine: " + FIX_LAUNCH,
    ),
    Column("error", lambda r: r.error or ""),
)


def measurement_table(
    engines: list[EngineResult],
) -> tuple[tuple[str, ...], list[list[str]], list[str]]:
    """(head, rows, notes): columns empty in every row are left out, each with a note why."""
    rows = [r for e in engines for r in e.rows]
    cells = [[c.cell(r) for c in COLUMNS] for r in rows]
    keep, notes = [], []
    if not rows:
        return (), [], []
    for j, col in enumerate(COLUMNS):
        empty = all(row[j] in ("", "—") for row in cells)
        if empty and (col.quiet or col.head == "error"):
            continue  # no failure anywhere is the good case, not a gap
        if empty and col.empty_why and rows:
            notes.append(f"{col.head}: not measured: {col.empty_why}")
            continue
        keep.append(j)
    if any(ENGINE in (r.ttft_source, r.per_seq_source) for r in rows):
        notes.append(ENGINE_CELLS)
    head = tuple(COLUMNS[j].head for j in keep)
    return head, [[row[j] for j in keep] for row in cells], notes


def phase_rows(engines: list[EngineResult]) -> list[list[str]]:
    """One row per phase, in time order."""
    out = []
    for e in engines:
        for p in e.phases:
            start = datetime.fromtimestamp(p.start, timezone.utc).strftime("%H:%M:%S.%f")[:-3]
            dur = f"{p.end - p.start:.2f}" if p.end is not None else "—"
            out.append([e.name, p.name, start, dur, gib(p.memory_bytes), p.note])
    return out
