"""What `diagnose` and `compare` measured, and the answer they give from it.

The data model (rows, engine results, the decision, the run's metadata) is shared by the
terminal output, `results.json`, `report.md` and `report.html`. The verdict of each engine
is never decided here: `engine_verdict` builds the decision core's `Signals` from the
measurements and calls `core.evaluate`, the same evaluator the Prometheus
recording rules are generated from. What is decided here is only what the rules cannot
see: the comparison of two engines (comparability, batching at equal load, long context,
spread over rounds) and the recommendation.
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import core

# The recommendation vocabulary of results.json (`switch_to:<engine>` names the engine).
STAY_AND_TUNE = "stay_and_tune"
FIX_MEMORY_FIRST = "fix_memory_first"
INCONCLUSIVE = "inconclusive"
SWITCH_TO = "switch_to:"

# Weight bytes per parameter differing by more than this: the raw speeds are not comparable.
PRECISION_TOLERANCE = 0.20

# A difference is called when the rounds' ranges do not overlap and the medians differ by
# more than this: on a shared host, back-to-back runs of one engine differ by a few percent.
MIN_DIFFERENCE = 0.05

NOT_MEASURED = "not measured: "


def switch_to(engine: str) -> str:
    """The recommendation to switch to `engine`."""
    return SWITCH_TO + engine


def utc_now() -> str:
    """Now in UTC, ISO 8601 with a `Z`."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class Phase:
    """One timestamped phase of a run (baseline, start, settle, single, ...)."""

    name: str
    start: float
    end: float | None = None
    memory_bytes: float | None = None
    peak_memory_bytes: float | None = None
    note: str = ""


@dataclass
class Row:
    """One measured step: a fixed context, slot count, prompt and concurrency, all else equal.

    With several rounds the headline figures are medians and `*_rounds` keep every round.
    """

    engine: str
    step: str  # first | single | concurrency | prompt | context | kv_pressure
    concurrency: int
    context: int | None = None
    parallel: int | None = None
    prompt_tokens: float | None = None
    max_tokens: int = 0
    requests: int = 0
    requests_failed: int = 0
    completion_tokens: int = 0
    tokens_ok: bool = False
    ttft_s: float | None = None
    ttft_p99_s: float | None = None
    per_seq_tok_s: float | None = None
    per_token_ms: float | None = None
    server_per_token_ms: float | None = None
    aggregate_tok_s: float | None = None
    aggregate_rounds: list[float] = field(default_factory=list)
    ttft_rounds: list[float] = field(default_factory=list)
    per_seq_rounds: list[float] = field(default_factory=list)
    wall_s: float | None = None
    memory_bytes: float | None = None
    loaded_memory_bytes: float | None = None
    kv_bytes: float | None = None
    load_seconds: float | None = None
    # Error kinds of the failed requests (kv_exhausted, early_stop, http_error, ...).
    errors: dict[str, int] = field(default_factory=dict)
    # KV pressure seen during the step: truncated slots, "context size exceeded" and
    # "no free KV space" log lines, KV usage and queued requests (exporter or log).
    truncated: int = 0
    kv_exhausted: int = 0
    kv_events: int = 0
    kv_usage_max: float | None = None
    waiting_avg: float | None = None
    error: str | None = None
    # The card's limit at this step's batch (`row_roofline`): bytes one decode step reads,
    # the per-sequence limit, measured per-sequence tok/s / limit, the physics reason.
    bytes_per_step: float | None = None
    limit_tok_s: float | None = None
    efficiency: float | None = None
    misfit: str | None = None

    @property
    def spread(self) -> float | None:
        """Relative spread of the aggregate tok/s over rounds ((max - min) / median)."""
        return relative_spread(self.aggregate_rounds)


@dataclass
class Roofline:
    """The card's decode limit for one engine and how much of it single-request decode uses.

    `bytes_per_step` = `active_weights_bytes` (weights one step reads: the always-read part,
    the routed experts a step touches, untied embedding rows) + KV in use x
    `kv_bytes_per_token` (+ a draft model's weights per proposed token); `limit_tok_s` =
    bandwidth x `accepted_tokens_per_step` / bytes per step. `misfit` is the physics gate:
    the reason (`core.MISFIT_REASONS`) when `efficiency` is beyond physics.
    """

    bandwidth_bytes_per_s: float | None = None
    bandwidth_source: str | None = None
    bytes_per_step: float | None = None
    limit_tok_s: float | None = None
    measured_tok_s: float | None = None
    efficiency: float | None = None
    active_weights_bytes: float | None = None
    kv_bytes_per_token: float | None = None
    accepted_tokens_per_step: float | None = None
    misfit: str | None = None

    @property
    def physical(self) -> bool:
        """Whether the efficiency may be shown as a share of the card's limit."""
        return self.misfit is None


@dataclass
class EngineResult:
    """Everything measured for one engine, and its verdict."""

    name: str
    kind: str
    url: str | None = None
    model: str | None = None
    quantization: str | None = None
    weights_bytes: float | None = None
    parameters: float | None = None
    process_gpu_bytes: float | None = None
    gpu_buffer_bytes: float | None = None
    layers_offloaded: float | None = None
    layers_total: float | None = None
    gpu_total_bytes: float | None = None
    gpu_name: str | None = None
    gpu_driver: str | None = None
    engine_version: str | None = None
    bandwidth_bytes_per_s: float | None = None
    bandwidth_source: str | None = None
    kv_bytes_per_token: float | None = None
    # The model's structure for the roofline (exporter series or the GGUF; None: unknown).
    always_read_bytes: float | None = None
    routed_expert_bytes: float | None = None
    experts: float | None = None
    experts_used: float | None = None
    token_embedding_row_bytes: float | None = None
    draft_weights_bytes: float | None = None
    # Speculative decoding: mean tokens per target-model step (None: not seen).
    spec_accept_length: float | None = None
    # Expert offload: layers whose routed experts live in host memory, and their bytes.
    experts_host_layers: float | None = None
    experts_host_bytes: float | None = None
    trained_context: int | None = None
    slot_context: int | None = None
    memory_source: str | None = None
    load_seconds: float | None = None
    launched: bool = False
    slots: int | None = None
    phases: list[Phase] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    # Steps that did not run, as "step: why".
    missing: list[str] = field(default_factory=list)
    # (unix time, memory bytes) samples taken during the run, for the timeline plot.
    timeline: list[tuple[float, float]] = field(default_factory=list)
    roofline: Roofline = field(default_factory=Roofline)
    # The decision core's inputs as measured by this run, and its answer.
    signals: dict[str, Any] = field(default_factory=dict)
    # What the verdict had to take from diagnose's own measurements, and why.
    notes: list[str] = field(default_factory=list)
    verdict: str | None = None
    action: str = ""

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
        """The load row at `concurrency` (the single row for 1)."""
        for step in ("concurrency", "single"):
            for r in self.ok_rows(step):
                if r.concurrency == concurrency and r.aggregate_tok_s:
                    return r
        return None

    def structure(self) -> core.ModelStructure | None:
        """What the roofline knows about this model (None without weights or structure)."""
        model = core.ModelStructure(
            weights_bytes=self.weights_bytes,
            always_read_bytes=self.always_read_bytes,
            routed_expert_bytes=self.routed_expert_bytes,
            experts=self.experts,
            experts_used=self.experts_used,
            token_embedding_row_bytes=self.token_embedding_row_bytes,
            draft_weights_bytes=self.draft_weights_bytes,
        )
        if not self.weights_bytes and not model.structure_known:
            return None
        return model

    def bytes_per_parameter(self) -> float | None:
        """Weight bytes per parameter (the precision actually served)."""
        if self.weights_bytes and self.parameters:
            return self.weights_bytes / self.parameters
        return None


@dataclass
class Step:
    """One question of the procedure, its answer (or `not measured: why`) and its numbers."""

    key: str
    question: str
    answer: str
    decisive: bool = False
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return not self.answer.startswith(NOT_MEASURED)


@dataclass
class Estimate:
    """A labelled estimate: what an engine would do at the other engine's precision."""

    engine: str
    at_precision_of: str
    tok_s: float
    basis: str


@dataclass
class Decision:
    """The answer: a verdict per engine, the recommendation, and why."""

    verdict: dict[str, str]
    recommendation: str
    action: str
    comparable: bool
    steps: list[Step]
    caveats: list[str] = field(default_factory=list)
    estimates: list[Estimate] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RunInfo:
    """Who ran what, when: the metadata block of every report."""

    command: str
    tool_version: str
    started_at: str
    finished_at: str | None = None


def relative_spread(values: list[float]) -> float | None:
    """(max - min) / median of the rounds; None with fewer than two rounds."""
    if len(values) < 2:
        return None
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med > 0 else None


def _pct(x: float) -> str:
    return f"{x * 100:.0f} %"


def _gib(value: float | None) -> str:
    return "?" if value is None else f"{value / 2**30:.2f} GiB"


# --- the verdict of one engine, through the decision core ---------------------------------


def bytes_per_step(
    engine: EngineResult, kv_tokens: float | None, batch: float = 1.0
) -> tuple[float | None, float | None]:
    """(bytes per decode step, active weight bytes) of `engine` at `batch` sequences holding
    `kv_tokens` KV tokens: the decision core's formula, whatever the bandwidth's source."""
    model = engine.structure()
    if model is None:
        return None, None
    per_step = core.decode_bytes_per_step(
        model, kv_tokens, engine.kv_bytes_per_token, batch, engine.spec_accept_length
    )
    return per_step, core.active_weights_bytes(model, batch)


def facts(engine: EngineResult) -> core.RooflineFacts:
    """What the bytes-per-step model of `engine` knows (for the physics gate)."""
    model = engine.structure()
    return core.roofline_facts(model if model is not None else 0.0, engine.spec_accept_length)


def row_batch(engine: EngineResult, row: Row) -> int:
    """Sequences one decode step of `row` holds: its concurrency, at most the slots."""
    return max(1, min(row.concurrency, engine.slots or row.concurrency))


def roofline(engine: EngineResult) -> Roofline:
    """Single-request decode against the card's limit (bytes read per step, physics-gated)."""
    return row_roofline(engine, engine.single())


def row_roofline(engine: EngineResult, row: Row | None) -> Roofline:
    """One step's per-sequence decode against the card's limit at that step's batch."""
    kv_tokens = None
    batch = row_batch(engine, row) if row is not None else 1
    if row is not None and row.prompt_tokens is not None:
        # Each sequence holds its prompt plus, on average, half of its output in the KV.
        kv_tokens = batch * (row.prompt_tokens + row.max_tokens / 2)
    bw = engine.bandwidth_bytes_per_s
    per_step, active = bytes_per_step(engine, kv_tokens, float(batch))
    accept = engine.spec_accept_length
    limit = core.roofline_tokens_per_second(bw, per_step, accept)
    measured = row.per_seq_tok_s if row else None
    eff = measured / limit if measured and limit else None
    reason = core.roofline_misfit(eff, facts(engine))
    return Roofline(
        bw,
        engine.bandwidth_source,
        per_step,
        limit,
        measured,
        eff,
        active_weights_bytes=active,
        kv_bytes_per_token=engine.kv_bytes_per_token,
        accepted_tokens_per_step=core.accepted_tokens(accept) if per_step else None,
        misfit=reason.name if reason is not None else None,
    )


def roofline_text(roof: Roofline) -> str:
    """`, N % of the card's limit ... (bandwidth ÷ bytes per step)`, or why it does not fit."""
    if roof.efficiency is None or not roof.limit_tok_s:
        return ""
    accepted = roof.accepted_tokens_per_step or 1.0
    spec = f" × {accepted:.2f} accepted tokens per step" if accepted != 1.0 else ""
    basis = (
        f"bandwidth {(roof.bandwidth_bytes_per_s or 0) / 1e9:.0f} GB/s{spec} ÷ "
        f"{(roof.bytes_per_step or 0) / 2**30:.2f} GiB per step"
    )
    if roof.active_weights_bytes is not None:
        basis += f", {roof.active_weights_bytes / 2**30:.2f} GiB of it weights"
    if roof.misfit is not None:
        reason = core.MISFIT_BY_NAME[roof.misfit]
        return (
            f"; {core.misfit_text(roof.efficiency, reason)} (limit {roof.limit_tok_s:.1f} "
            f"tok/s from {basis})"
        )
    return (
        f", {roof.efficiency * 100:.0f} % of the card's limit {roof.limit_tok_s:.1f} tok/s "
        f"({basis})"
    )


def row_roofline_text(engine: EngineResult, row: Row) -> str:
    """`; per sequence X tok/s = N % of the limit L tok/s at B sequences (G GiB per step)`."""
    if row.per_seq_tok_s is None or row.limit_tok_s is None or row.efficiency is None:
        return ""
    head = (
        f"; per sequence {row.per_seq_tok_s:.1f} tok/s against the limit "
        f"{row.limit_tok_s:.1f} tok/s at {row_batch(engine, row)} sequences "
        f"({(row.bytes_per_step or 0) / 2**30:.2f} GiB per step)"
    )
    if row.misfit is not None:
        return head + f": beyond physics ({row.misfit}), no decode claim"
    return head + f" = {row.efficiency * 100:.0f} %"


def engine_verdict(engine: EngineResult, signals: core.Signals) -> tuple[str, str]:
    """(verdict, action) of the decision core for what was measured on `engine`.

    The physics gate: when the decode efficiency behind the verdict is beyond physics, the
    core claims no decode verdict (the fallback) and the action says why the roofline does
    not fit instead of how to tune decode. Expert offload names its layers, bytes and bound.
    """
    decided = core.evaluate(signals)
    action = str(decided.action)
    eff = signals.decode_efficiency
    reason = core.roofline_misfit(eff, facts(engine))
    if reason is not None and eff is not None and decided.name == "decode_below_card_limit":
        action = core.misfit_text(eff, reason) + "."
    if decided.name == "weights_not_resident" and "experts_host" in decided.evidence:
        model = engine.structure()
        share = 1.0
        if model is not None and model.experts_known and model.experts and model.experts_used:
            share = core.expert_share(model.experts, model.experts_used, 1.0)
        action = (
            core.expert_offload_action(engine.experts_host_layers, engine.experts_host_bytes, share)
            + " "
            + action
        )
    return str(decided.name), action


def roofline_fraction(engine: EngineResult) -> float | None:
    """Single-request decode as a share of the card's limit (None when unknown)."""
    return roofline(engine).efficiency


def roofline_tok_s(engine: EngineResult) -> float | None:
    """The card's per-sequence decode limit for this engine's model, tok/s."""
    return roofline(engine).limit_tok_s


# --- what diagnose says -------------------------------------------------------------------


def recommendation_for(verdict: str | None) -> str:
    """A single engine's recommendation: fix memory, or stay and tune what the verdict names."""
    if verdict is None or verdict == "idle":
        return INCONCLUSIVE
    if verdict == "weights_not_resident":
        return FIX_MEMORY_FIRST
    return STAY_AND_TUNE


def decide_single(engine: EngineResult, steps: list[Step] | None = None) -> Decision:
    """diagnose's answer: the engine's verdict first, then the action (and the steps)."""
    rec = recommendation_for(engine.verdict)
    action = engine.action or "nothing was measured under load: run diagnose with load steps"
    caveats = _token_caveats(engine) + [f"{engine.name}: {n}" for n in engine.notes]
    return Decision(
        verdict={engine.name: engine.verdict or "idle"},
        recommendation=rec,
        action=action,
        comparable=True,
        steps=list(steps or []),
        caveats=caveats,
    )


def _token_caveats(engine: EngineResult) -> list[str]:
    # The KV-pressure step cuts requests on purpose where the KV cache runs out.
    bad = [
        r
        for r in engine.rows
        if r.error is None and not r.tokens_ok and r.requests and r.step != "kv_pressure"
    ]
    if bad:
        return [f"{engine.name}: token counts differ from max_tokens in {len(bad)} step(s)"]
    return []


# --- what compare says --------------------------------------------------------------------


@dataclass
class Call:
    """One measured difference: who is ahead, by how much, and whether it beats the spread."""

    what: str
    concurrency: int | None
    a: float
    b: float
    spread: float | None
    winner: str | None  # engine name, None within the spread

    def ratio(self) -> float:
        return self.b / self.a if self.a else math.inf


def _call(
    what: str,
    concurrency: int | None,
    a: EngineResult,
    b: EngineResult,
    va: list[float],
    vb: list[float],
    higher_is_better: bool = True,
) -> Call | None:
    """Median of each engine's rounds; a winner only when the rounds' ranges do not overlap
    (and the medians differ by more than `MIN_DIFFERENCE`).

    One round has no spread: nothing is called from it.
    """
    if not va or not vb:
        return None
    ma, mb = statistics.median(va), statistics.median(vb)
    spreads = [s for s in (relative_spread(va), relative_spread(vb)) if s is not None]
    spread = max(spreads) if spreads else None
    winner = None
    apart = abs(mb - ma) / min(ma, mb) > MIN_DIFFERENCE if min(ma, mb) > 0 else False
    if len(va) >= 2 and len(vb) >= 2 and apart:
        if min(vb) > max(va):
            winner = b.name if higher_is_better else a.name
        elif min(va) > max(vb):
            winner = a.name if higher_is_better else b.name
    return Call(what, concurrency, ma, mb, spread, winner)


def comparability(a: EngineResult, b: EngineResult) -> tuple[bool, str]:
    """Whether the raw speeds compare like with like (weight bytes per parameter within 20 %)."""
    pa, pb = a.bytes_per_parameter(), b.bytes_per_parameter()
    basis = "weight bytes per parameter"
    if pa is None or pb is None:
        # The same model served twice: the weight sizes alone tell the precision apart.
        pa, pb, basis = a.weights_bytes, b.weights_bytes, "weight bytes"
    if pa and pb:
        diff = abs(pa - pb) / min(pa, pb)
        qa, qb = a.quantization or "?", b.quantization or "?"
        if diff > PRECISION_TOLERANCE:
            unit = "" if basis == "weight bytes" else " B/param"
            fa = f"{pa / 2**30:.1f} GiB" if basis == "weight bytes" else f"{pa:.2f}{unit}"
            fb = f"{pb / 2**30:.1f} GiB" if basis == "weight bytes" else f"{pb:.2f}{unit}"
            return False, (
                f"different precision: {a.name} serves {qa} ({basis} {fa}), {b.name} {qb} "
                f"({fb}), {diff * 100:.0f} % apart (> {PRECISION_TOLERANCE * 100:.0f} %): raw "
                "speeds are not comparable; compare on the same weights"
            )
        return True, f"same precision: {basis} within {diff * 100:.0f} % ({qa} vs {qb})"
    qa, qb = (a.quantization or "").lower(), (b.quantization or "").lower()
    if qa and qb and qa != qb:
        return False, (
            f"different quantization: {a.name} {a.quantization}, {b.name} {b.quantization} "
            "(weight sizes unknown): raw speeds are not comparable"
        )
    return True, "precision unknown for at least one engine: assumed comparable"


def estimates(a: EngineResult, b: EngineResult) -> list[Estimate]:
    """Each engine at the other's precision, assuming it keeps its share of the roofline."""
    out = []
    for x, y in ((a, b), (b, a)):
        # A share beyond physics estimates nothing (the physics gate).
        if not (x.roofline.physical and y.roofline.physical):
            continue
        if x.roofline.efficiency is not None and y.roofline.limit_tok_s is not None:
            out.append(
                Estimate(
                    engine=x.name,
                    at_precision_of=y.name,
                    tok_s=x.roofline.efficiency * y.roofline.limit_tok_s,
                    basis=(
                        f"estimate: {x.name}'s {_pct(x.roofline.efficiency)} of the roofline "
                        f"× {y.name}'s limit {y.roofline.limit_tok_s:.1f} tok/s"
                    ),
                )
            )
    return out


def failed_contexts(engine: EngineResult) -> list[int]:
    """Contexts at which the engine could not start or generate (memory gave out)."""
    return sorted(r.context for r in engine.rows if r.step == "context" and r.context and r.error)


def max_context_loaded(engine: EngineResult) -> int | None:
    """Largest context at which the engine started and generated, None if no context rows."""
    ok = [r.context for r in engine.ok_rows("context") if r.context]
    return max(ok) if ok else None


def decide_compare(a: EngineResult, b: EngineResult) -> Decision:
    """`a` is the engine in use, `b` the candidate; in the seed's order."""
    steps: list[Step] = []
    caveats = _token_caveats(a) + _token_caveats(b)
    caveats += [f"{e.name}: {n}" for e in (a, b) for n in e.notes]
    verdicts = {e.name: e.verdict or "idle" for e in (a, b)}

    # 1. Residency: an engine whose weights are not on the GPU measures its PCIe link.
    not_resident = [e.name for e in (a, b) if e.verdict == "weights_not_resident"]
    steps.append(
        Step(
            "residency",
            "Do the weights fit and stay resident?",
            ("no: " + ", ".join(not_resident)) if not_resident else "yes, on both engines",
            bool(not_resident),
            {e.name: {"verdict": e.verdict, "weights_bytes": e.weights_bytes} for e in (a, b)},
        )
    )

    # 2. Comparability: the same precision, or compare shares of the roofline.
    comparable, why = comparability(a, b)
    ests = estimates(a, b) if not comparable else []
    if not comparable:
        caveats.append(why)
        effs = ", ".join(
            f"{e.name} beyond physics ({e.roofline.misfit}: the roofline does not fit)"
            if e.roofline.misfit is not None
            else f"{e.name} {_pct(e.roofline.efficiency)}"
            if e.roofline.efficiency is not None
            else f"{e.name} unknown (pass --bandwidth-gbs)"
            for e in (a, b)
        )
        why += f". Share of the card's decode limit: {effs}"
    steps.append(
        Step(
            "comparability",
            "Same precision (weight bytes per parameter within 20 %)?",
            why,
            not comparable,
            {
                e.name: {
                    "quantization": e.quantization,
                    "bytes_per_parameter": e.bytes_per_parameter(),
                    "weights_bytes": e.weights_bytes,
                    "roofline_efficiency": e.roofline.efficiency,
                    "roofline_tok_s": e.roofline.limit_tok_s,
                    "roofline_misfit": e.roofline.misfit,
                }
                for e in (a, b)
            },
        )
    )

    # 3. Single-request decode and 4. batching at every common concurrency.
    calls: list[Call] = []
    sa, sb = a.single(), b.single()
    single_call = (
        _call(
            "single-request decode tok/s",
            1,
            a,
            b,
            sa.per_seq_rounds or [sa.per_seq_tok_s or 0],
            sb.per_seq_rounds or [sb.per_seq_tok_s or 0],
        )
        if sa and sb
        else None
    )
    steps.append(_call_step("decode", "Single-request decode: who is faster?", single_call, a, b))
    if single_call:
        calls.append(single_call)
    common = sorted(
        {r.concurrency for r in a.ok_rows("concurrency")}
        & {r.concurrency for r in b.ok_rows("concurrency")}
    )
    batch_calls = []
    for c in common:
        ra, rb = a.at_concurrency(c), b.at_concurrency(c)
        if ra is None or rb is None:
            continue
        agg = _call(
            "aggregate tok/s",
            c,
            a,
            b,
            ra.aggregate_rounds or [ra.aggregate_tok_s or 0],
            rb.aggregate_rounds or [rb.aggregate_tok_s or 0],
        )
        ttft = _call(
            "TTFT s",
            c,
            a,
            b,
            ra.ttft_rounds or [ra.ttft_s or 0],
            rb.ttft_rounds or [rb.ttft_s or 0],
            higher_is_better=False,
        )
        batch_calls += [x for x in (agg, ttft) if x]
    calls += batch_calls
    steps.append(
        Step(
            "batching",
            "At equal load, which engine gives more aggregate tok/s and a shorter TTFT?",
            "; ".join(_call_text(x, a, b) for x in batch_calls)
            if batch_calls
            else NOT_MEASURED + "no common concurrency > 1 with successful requests",
            any(x.winner for x in batch_calls),
            {"calls": [asdict(x) for x in batch_calls]},
        )
    )

    # 5. Long context: whose memory gives out first.
    fa, fb = failed_contexts(a), failed_contexts(b)
    ma, mb = max_context_loaded(a), max_context_loaded(b)
    ctx_winner = None
    if fa and mb and mb >= min(fa) and (not fb or min(fb) > min(fa)):
        ctx_winner = b.name
    elif fb and ma and ma >= min(fb) and (not fa or min(fa) > min(fb)):
        ctx_winner = a.name
    if ma is None and mb is None and not fa and not fb:
        ans = NOT_MEASURED + "no context sweep ran (needs launch templates with {ctx})"
    else:
        ans = "; ".join(
            f"{e.name}: largest context loaded {m if m else 'none'}"
            + (f", memory gave out at {min(f)}" if f else "")
            for e, f, m in ((a, fa, ma), (b, fb, mb))
        )
    steps.append(
        Step(
            "long_context",
            "Long context: whose memory gives out first?",
            ans,
            ctx_winner is not None,
            {a.name: {"max_loaded": ma, "failed": fa}, b.name: {"max_loaded": mb, "failed": fb}},
        )
    )

    rec, action = _recommend(a, b, not_resident, comparable, calls, ctx_winner, ests)
    return Decision(verdicts, rec, action, comparable, steps, caveats, ests)


def _call_text(x: Call, a: EngineResult, b: EngineResult) -> str:
    where = f" at concurrency {x.concurrency}" if x.concurrency else ""
    spread = f"spread {_pct(x.spread)}" if x.spread is not None else "one round: no spread"
    verdict = f"{x.winner} ahead" if x.winner else "no difference beyond the spread"
    return f"{x.what}{where}: {a.name} {x.a:.3g} vs {b.name} {x.b:.3g} ({spread}; {verdict})"


def _call_step(key: str, question: str, x: Call | None, a: EngineResult, b: EngineResult) -> Step:
    if x is None:
        return Step(key, question, NOT_MEASURED + "no single-request row on both engines")
    return Step(key, question, _call_text(x, a, b), x.winner is not None, asdict(x))


def _recommend(
    a: EngineResult,
    b: EngineResult,
    not_resident: list[str],
    comparable: bool,
    calls: list[Call],
    ctx_winner: str | None,
    ests: list[Estimate],
) -> tuple[str, str]:
    if not_resident:
        who = " and ".join(not_resident)
        return FIX_MEMORY_FIRST, (
            f"fix memory first: the weights of {who} are not all on the GPU, so its speed "
            "measures host memory, not the engine. "
            + core.VERDICT_INFO["weights_not_resident"].action
        )
    if not comparable:
        est = "; ".join(f"{e.basis} ≈ {e.tok_s:.1f} tok/s" for e in ests)
        return INCONCLUSIVE, (
            "the engines serve different precisions, so which engine is faster is not "
            "decided by these numbers: run both on the same weights." + (f" {est}." if est else "")
        )
    wins = [x for x in calls if x.winner]
    if ctx_winner:
        wins.append(Call("long context", None, 0, 0, None, ctx_winner))
    if not wins:
        if not calls:
            return INCONCLUSIVE, "nothing was measured on both engines under the same load"
        return INCONCLUSIVE, (
            "no difference beyond the spread between rounds: "
            "neither engine is faster under this load; raise --rounds to narrow the spread"
        )
    # The highest concurrency decides when the engines win at different loads.
    load_wins = sorted((x for x in wins if x.concurrency), key=lambda x: x.concurrency or 0)
    decisive = load_wins[-1] if load_wins else wins[-1]
    winner = decisive.winner
    assert winner is not None
    where = f" at concurrency {decisive.concurrency}" if decisive.concurrency else ""
    ratio = decisive.b / decisive.a if decisive.a else None
    ratio_text = (
        f" ({decisive.what}: {b.name}/{a.name} = {ratio:.2f})"
        if ratio is not None and decisive.what != "long context"
        else ""
    )
    others = [x for x in wins if x.winner != winner]
    other_text = (
        "; but "
        + ", ".join(f"{x.winner} wins {x.what} at concurrency {x.concurrency}" for x in others)
        if others
        else ""
    )
    if winner == b.name:
        return switch_to(b.name), f"switch to {b.name}{where}{ratio_text}{other_text}"
    return STAY_AND_TUNE, (
        f"stay on {a.name} and tune{where}{ratio_text}{other_text}. {a.action}".rstrip(". ")
    )


# --- results.json ---------------------------------------------------------------------------


def results_to_dict(
    engines: list[EngineResult], decision: Decision, run: RunInfo | None = None
) -> dict[str, Any]:
    """The results.json document: the answer first, then every number."""
    doc: dict[str, Any] = {
        "verdict": decision.verdict,
        "recommendation": decision.recommendation,
        "action": decision.action,
        "comparable": decision.comparable,
        "caveats": decision.caveats,
    }
    if run is not None:
        doc.update(asdict(run))
    doc["decision"] = decision.to_dict()
    doc["engines"] = [asdict(e) for e in engines]
    return doc


def engine_from_dict(data: dict[str, Any]) -> EngineResult:
    """Rebuild an EngineResult from its results.json form."""
    data = dict(data)
    phases = [Phase(**p) for p in data.pop("phases", [])]
    rows = [Row(**r) for r in data.pop("rows", [])]
    roof = Roofline(**(data.pop("roofline", None) or {}))
    timeline = [(float(t), float(v)) for t, v in data.pop("timeline", [])]
    return EngineResult(**data, phases=phases, rows=rows, roofline=roof, timeline=timeline)
