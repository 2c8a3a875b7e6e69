"""The diagnosis: results data model and the decision, in the seed's order.

Everything here is a pure function of the measured numbers, so the rules can be
tested with tables. The order is fixed: (1) do the weights fit and stay resident,
(2) is single-request per-token decode within ~10 % between engines, (3) does one
engine give clearly more aggregate throughput at the same concurrency (batching /
KV scheduling), (4) whose memory gives out first at long context; plus the
roofline "the card is at X % of its limit".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Single-request decode speeds closer than this are "the same": switching gains little.
SIMILAR_DECODE = 0.10
# Aggregate throughput this much higher at the same concurrency is "clearly higher".
CLEAR_AGGREGATE = 0.20
# Process GPU memory below this fraction of the weight bytes means weights are not resident.
RESIDENT_FRACTION = 0.90
# Aggregate at the highest concurrency below this multiple of single-request decode: no batching.
POOR_SCALING = 1.30
# Memory use above this fraction of the card's total is "full".
MEMORY_FULL = 0.95

STAY = "stay and tune"
SWITCH = "switch"
FIX_MEMORY = "fix memory first"


@dataclass
class Phase:
    """One timestamped phase of a diagnose run (baseline, start, settle, ...)."""

    name: str
    start: float
    end: float | None = None
    memory_bytes: float | None = None
    peak_memory_bytes: float | None = None
    note: str = ""


@dataclass
class Row:
    """One measured step: a fixed context, slot count and concurrency, all else equal."""

    engine: str
    step: str
    concurrency: int
    context: int | None = None
    parallel: int | None = None
    prompt_tokens: float | None = None
    max_tokens: int = 0
    requests: int = 0
    completion_tokens: int = 0
    tokens_ok: bool = False
    ttft_s: float | None = None
    per_seq_tok_s: float | None = None
    per_token_ms: float | None = None
    server_per_token_ms: float | None = None
    aggregate_tok_s: float | None = None
    wall_s: float | None = None
    memory_bytes: float | None = None
    loaded_memory_bytes: float | None = None
    kv_bytes: float | None = None
    load_seconds: float | None = None
    error: str | None = None


@dataclass
class EngineResult:
    """Everything measured for one engine."""

    name: str
    kind: str
    model: str | None = None
    quantization: str | None = None
    weights_bytes: float | None = None
    process_gpu_bytes: float | None = None
    layers_offloaded: float | None = None
    layers_total: float | None = None
    gpu_total_bytes: float | None = None
    bandwidth_bytes_per_s: float | None = None
    memory_source: str | None = None
    load_seconds: float | None = None
    launched: bool = False
    slots: int | None = None
    phases: list[Phase] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    # (unix time, memory bytes) samples taken during the run, for the timeline plot.
    timeline: list[tuple[float, float]] = field(default_factory=list)

    def ok_rows(self, step: str | None = None) -> list[Row]:
        """Rows without an error, optionally of one step kind."""
        return [r for r in self.rows if r.error is None and (step is None or r.step == step)]

    def single(self) -> Row | None:
        """The single-sequence decode row (concurrency 1)."""
        rows = [r for r in self.ok_rows() if r.concurrency == 1 and r.per_seq_tok_s]
        preferred = [r for r in rows if r.step == "single"]
        pick = preferred or rows
        return pick[0] if pick else None

    def at_concurrency(self, concurrency: int) -> Row | None:
        """The concurrency-sweep row at `concurrency` (single row for 1)."""
        for step in ("concurrency", "single"):
            for r in self.ok_rows(step):
                if r.concurrency == concurrency and r.aggregate_tok_s:
                    return r
        return None


@dataclass
class Step:
    """One question of the decision with its answer and the numbers behind it."""

    number: int
    question: str
    answer: str
    decisive: bool = False
    numbers: dict[str, Any] = field(default_factory=dict)


@dataclass
class Decision:
    """The outcome: action (stay and tune / switch / fix memory first) and why."""

    action: str
    verdict: str
    recommendation: str
    steps: list[Step]
    roofline: dict[str, float | None]
    caveats: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pct(x: float) -> str:
    return f"{x * 100:.0f} %"


def roofline_fraction(engine: EngineResult) -> float | None:
    """Single-sequence decode as a fraction of bandwidth ÷ weight bytes (the decode limit)."""
    row = engine.single()
    if (
        row is None
        or not row.per_seq_tok_s
        or not engine.weights_bytes
        or not engine.bandwidth_bytes_per_s
    ):
        return None
    limit = engine.bandwidth_bytes_per_s / engine.weights_bytes
    return row.per_seq_tok_s / limit


def roofline_tok_s(engine: EngineResult) -> float | None:
    """The card's decode limit for this model in tokens/s per sequence."""
    if not engine.weights_bytes or not engine.bandwidth_bytes_per_s:
        return None
    return engine.bandwidth_bytes_per_s / engine.weights_bytes


def weights_problem(engine: EngineResult) -> str | None:
    """Why the weights do not fit / are not resident, or None when they are (or it is unknown)."""
    # Zero layers offloaded without any GPU memory source is a CPU-only build, not a problem.
    cpu_only = engine.layers_offloaded == 0 and engine.memory_source != "gpu"
    if engine.layers_offloaded is not None and engine.layers_total and not cpu_only:
        if engine.layers_offloaded < engine.layers_total:
            return (
                f"{engine.name}: only {engine.layers_offloaded:.0f}/{engine.layers_total:.0f} "
                "layers on the GPU (the rest decode from host memory over PCIe)"
            )
    if (
        engine.memory_source == "gpu"
        and engine.process_gpu_bytes is not None
        and engine.weights_bytes
        and engine.process_gpu_bytes < RESIDENT_FRACTION * engine.weights_bytes
    ):
        return (
            f"{engine.name}: process GPU memory {engine.process_gpu_bytes / 2**30:.2f} GiB < "
            f"{_pct(RESIDENT_FRACTION)} of the weights {engine.weights_bytes / 2**30:.2f} GiB"
        )
    ctx_rows = sorted(
        (r for r in engine.rows if r.step == "context" and r.context), key=lambda r: r.context or 0
    )
    if ctx_rows and all(r.error for r in ctx_rows):
        return f"{engine.name}: the engine did not start at any context ({ctx_rows[0].error})"
    return None


def max_context_loaded(engine: EngineResult) -> int | None:
    """Largest context at which the engine started and generated, None if no context rows."""
    ok = [r.context for r in engine.rows if r.step == "context" and r.context and not r.error]
    return max(ok) if ok else None


def failed_contexts(engine: EngineResult) -> list[int]:
    """Contexts at which the engine could not start or generate (memory gave out)."""
    out = []
    for r in engine.rows:
        if r.step != "context" or not r.context:
            continue
        full = (
            engine.gpu_total_bytes
            and r.loaded_memory_bytes
            and engine.memory_source == "gpu"
            and r.loaded_memory_bytes > MEMORY_FULL * engine.gpu_total_bytes
        )
        if r.error or full:
            out.append(r.context)
    return sorted(out)


def tuning_flags(engine: EngineResult) -> list[str]:
    """Engine flags worth tuning given what was measured for one engine."""
    llama = engine.kind == "llamacpp"
    flags = []
    if weights_problem(engine):
        flags.append(
            "-ngl 999 (all layers on the GPU) or a smaller quantization"
            if llama
            else "--mem-fraction-static / no --cpu-offload-gb"
        )
    single = engine.single()
    top = max((r for r in engine.ok_rows("concurrency")), key=lambda r: r.concurrency, default=None)
    if single and top and top.concurrency > 1 and single.per_seq_tok_s and top.aggregate_tok_s:
        too_few_slots = engine.slots is not None and engine.slots < top.concurrency
        if too_few_slots or top.aggregate_tok_s < POOR_SCALING * single.per_seq_tok_s:
            flags.append(
                (
                    f"-np {top.concurrency} (parallel slots >= concurrency; raise -c with it)"
                    if llama
                    else f"--max-running-requests >= {top.concurrency}"
                )
                + (
                    f": {engine.slots} slots for {top.concurrency} requests"
                    if too_few_slots
                    else ""
                )
            )
    failed = failed_contexts(engine)
    if failed:
        best = max_context_loaded(engine)
        flags.append(
            (f"-c {best}" if llama else f"--context-length {best}")
            + f" (memory gave out at {min(failed)})"
            if best
            else ("-c lower" if llama else "--context-length lower")
        )
    frac = roofline_fraction(engine)
    on_cpu = engine.memory_source != "gpu" and not engine.layers_offloaded
    if llama and (frac is None or frac < 0.5) and on_cpu:
        flags.append("-t <physical cores> (CPU decode is thread bound)")
    elif frac is not None and frac < 0.5:
        flags.append(
            "check offload and batch size (decode is far below the bandwidth limit)"
            if llama
            else "--attention-backend / CUDA graphs (decode is far below the bandwidth limit)"
        )
    return flags


def _step1(engines: list[EngineResult]) -> Step:
    problems = [p for p in (weights_problem(e) for e in engines) if p]
    numbers: dict[str, Any] = {}
    for e in engines:
        numbers[e.name] = {
            "weights_bytes": e.weights_bytes,
            "process_gpu_bytes": e.process_gpu_bytes,
            "layers_offloaded": e.layers_offloaded,
            "layers_total": e.layers_total,
        }
    if problems:
        return Step(1, "Do the weights fit and stay resident?", "; ".join(problems), True, numbers)
    known = any(
        (e.layers_total is not None or (e.memory_source == "gpu" and e.process_gpu_bytes))
        for e in engines
    )
    answer = "yes" if known else "not measured (no GPU data): assumed yes"
    if all(
        not e.layers_offloaded and e.memory_source != "gpu" and e.memory_source is not None
        for e in engines
    ):
        answer = "CPU-only run: no GPU found, the weights are in host memory"
    return Step(1, "Do the weights fit and stay resident?", answer, False, numbers)


def _roofline_map(engines: list[EngineResult]) -> dict[str, float | None]:
    return {e.name: roofline_fraction(e) for e in engines}


def _roofline_text(engines: list[EngineResult]) -> str:
    parts = []
    for e in engines:
        frac = roofline_fraction(e)
        if frac is None:
            parts.append(f"{e.name}: roofline unknown (no bandwidth or weight size)")
        else:
            parts.append(f"{e.name}: the card is at {_pct(frac)} of its decode limit")
    return "; ".join(parts)


def decide_single(engine: EngineResult) -> Decision:
    """The decision for one engine: fix memory first or stay and tune (which flags)."""
    steps = [_step1([engine])]
    single = engine.single()
    steps.append(
        Step(
            2,
            "Single-request per-token decode",
            f"{single.per_seq_tok_s:.1f} tok/s ({single.per_token_ms:.1f} ms/token)"
            if single and single.per_seq_tok_s and single.per_token_ms
            else "not measured",
            False,
            {"per_seq_tok_s": single.per_seq_tok_s if single else None},
        )
    )
    top = max(engine.ok_rows("concurrency"), key=lambda r: r.concurrency, default=None)
    scaling = (
        top.aggregate_tok_s / single.per_seq_tok_s
        if top and single and top.aggregate_tok_s and single.per_seq_tok_s
        else None
    )
    steps.append(
        Step(
            3,
            "Concurrency: does aggregate throughput grow?",
            f"x{scaling:.2f} at concurrency {top.concurrency}"
            if scaling is not None and top
            else "not measured",
            False,
            {"scaling": scaling, "concurrency": top.concurrency if top else None},
        )
    )
    failed = failed_contexts(engine)
    steps.append(
        Step(
            4,
            "Long context: does memory give out?",
            f"yes at {min(failed)} tokens" if failed else "no (every context loaded)",
            False,
            {"max_context_loaded": max_context_loaded(engine), "failed": failed},
        )
    )
    flags = tuning_flags(engine)
    if steps[0].decisive:
        action, verdict = FIX_MEMORY, FIX_MEMORY
        rec = f"fix memory first: {steps[0].answer}. Flags: " + "; ".join(flags)
    else:
        action, verdict = STAY, STAY
        rec = "stay and tune: " + ("; ".join(flags) if flags else "nothing stands out")
    rec += ". " + _roofline_text([engine])
    return Decision(action, verdict, rec, steps, _roofline_map([engine]))


def quantization_caveat(a: EngineResult, b: EngineResult) -> str | None:
    """A caveat when the two engines serve different quantizations/precisions."""
    qa, qb = (a.quantization or "").strip(), (b.quantization or "").strip()
    if not qa or not qb:
        missing = [e.name for e, q in ((a, qa), (b, qb)) if not q]
        return f"quantization unknown for {', '.join(missing)}: cannot check that they match"
    if _norm_quant(qa) != _norm_quant(qb):
        return (
            f"different precision: {a.name} runs {qa}, {b.name} runs {qb}; "
            "decode speed scales with weight bytes, so discount the faster one accordingly"
        )
    return None


def _norm_quant(q: str) -> str:
    q = q.lower().replace("-", "").replace("_", "").replace(" ", "")
    aliases = {"f16": "float16", "fp16": "float16", "bf16": "bfloat16", "mostlyf16": "float16"}
    return aliases.get(q, q)


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x and y else None


def decide_compare(a: EngineResult, b: EngineResult) -> Decision:
    """The decision for `a` (the engine in use) against `b`, in the seed's order."""
    caveats = []
    qc = quantization_caveat(a, b)
    if qc:
        caveats.append(qc)
    for e in (a, b):
        bad = [r for r in e.ok_rows() if not r.tokens_ok]
        if bad:
            caveats.append(f"{e.name}: token counts differ from max_tokens in {len(bad)} row(s)")
    steps = [_step1([a, b])]

    sa, sb = a.single(), b.single()
    single_ratio = _ratio(sb.per_seq_tok_s if sb else None, sa.per_seq_tok_s if sa else None)
    similar = single_ratio is not None and abs(single_ratio - 1) <= SIMILAR_DECODE
    if single_ratio is None:
        ans2 = "not measured for both engines"
    else:
        ans2 = (
            f"{a.name} {sa.per_seq_tok_s:.1f} tok/s vs {b.name} {sb.per_seq_tok_s:.1f} tok/s "  # type: ignore[union-attr]
            f"({b.name}/{a.name} = {single_ratio:.2f}): "
            + ("within 10 %, switching gains little" if similar else "differ by more than 10 %")
        )
    steps.append(
        Step(
            2,
            "Single-request per-token decode within ~10 %?",
            ans2,
            False,
            {
                "ratio": single_ratio,
                a.name: sa.per_seq_tok_s if sa else None,
                b.name: sb.per_seq_tok_s if sb else None,
            },
        )
    )

    common = sorted(
        {r.concurrency for r in a.ok_rows() if r.aggregate_tok_s}
        & {r.concurrency for r in b.ok_rows() if r.aggregate_tok_s}
    )
    top = common[-1] if common else None
    ra = a.at_concurrency(top) if top else None
    rb = b.at_concurrency(top) if top else None
    agg_ratio = _ratio(rb.aggregate_tok_s if rb else None, ra.aggregate_tok_s if ra else None)
    if agg_ratio is None or top is None or top <= 1:
        ans3 = "no common concurrency > 1 measured"
    else:
        ans3 = (
            f"at concurrency {top}: {a.name} {ra.aggregate_tok_s:.1f} tok/s vs {b.name} "  # type: ignore[union-attr]
            f"{rb.aggregate_tok_s:.1f} tok/s aggregate ({b.name}/{a.name} = {agg_ratio:.2f})"  # type: ignore[union-attr]
        )
    steps.append(
        Step(
            3,
            "Same single-request speed but clearly higher aggregate throughput on one engine?",
            ans3,
            False,
            {"concurrency": top, "ratio": agg_ratio},
        )
    )

    fa, fb = failed_contexts(a), failed_contexts(b)
    ma, mb = max_context_loaded(a), max_context_loaded(b)
    if not fa and not fb:
        ans4 = "neither engine ran out of memory at the contexts measured"
        if ma is None and mb is None:
            ans4 = "context sweep not measured"
    else:
        ans4 = "; ".join(
            f"{e.name} gave out at {min(f)} tokens (largest loaded {m})"
            for e, f, m in ((a, fa, ma), (b, fb, mb))
            if f
        )
    steps.append(
        Step(
            4,
            "Long context: whose memory gives out first?",
            ans4,
            False,
            {a.name: {"max_loaded": ma, "failed": fa}, b.name: {"max_loaded": mb, "failed": fb}},
        )
    )

    roof = _roofline_text([a, b])
    if steps[0].decisive:
        action = verdict = FIX_MEMORY
        rec = f"fix memory first: {steps[0].answer}"
    elif (
        similar
        and agg_ratio is not None
        and top is not None
        and top > 1
        and abs(agg_ratio - 1) > CLEAR_AGGREGATE
    ):
        steps[2].decisive = True
        if agg_ratio > 1:
            action, verdict = SWITCH, "switch: batching"
            rec = (
                f"switch to {b.name}: same single-request speed but {agg_ratio:.2f}x the aggregate "
                f"throughput at concurrency {top} — batching/KV scheduling is the difference"
            )
        else:
            action, verdict = STAY, STAY
            rec = (
                f"stay on {a.name} and tune: it batches better ({1 / agg_ratio:.2f}x aggregate at "
                f"concurrency {top}); flags: " + ("; ".join(tuning_flags(a)) or "none needed")
            )
    elif single_ratio is not None and not similar and single_ratio > 1:
        steps[1].decisive = True
        action, verdict = SWITCH, "switch: decode"
        rec = f"switch to {b.name}: single-request decode is {single_ratio:.2f}x faster"
        if qc and qc.startswith("different"):
            rec += f" (but {qc})"
    elif fa and (not fb or min(fb) > min(fa)) and mb and mb >= min(fa):
        steps[3].decisive = True
        action, verdict = SWITCH, "switch: long context"
        rec = (
            f"switch to {b.name}: {a.name}'s memory gives out at {min(fa)} tokens, "
            f"{b.name} loads {mb}"
        )
    else:
        action, verdict = STAY, STAY
        why = (
            "single-request decode within 10 % and no clear batching difference"
            if similar
            else f"{a.name} is not slower"
        )
        rec = f"stay on {a.name} and tune ({why}); flags: " + (
            "; ".join(tuning_flags(a)) or "none needed"
        )
    rec += ". " + roof
    return Decision(action, verdict, rec, steps, _roofline_map([a, b]), caveats)


def results_to_dict(engines: list[EngineResult], decision: Decision) -> dict[str, Any]:
    """The results.json document: every number plus verdict and recommendation."""
    return {
        "verdict": decision.verdict,
        "action": decision.action,
        "recommendation": decision.recommendation,
        "caveats": decision.caveats,
        "decision": decision.to_dict(),
        "engines": [asdict(e) for e in engines],
    }


def engine_from_dict(data: dict[str, Any]) -> EngineResult:
    """Rebuild an EngineResult from its results.json form."""
    data = dict(data)
    phases = [Phase(**p) for p in data.pop("phases", [])]
    rows = [Row(**r) for r in data.pop("rows", [])]
    return EngineResult(**data, phases=phases, rows=rows)
