"""What `compare` says: comparability, batching at equal load, long context, spread over
rounds, and the recommendation. The engines' verdicts come from `core.conditions.evaluate` (through
`diagnose.decision.one_engine`); only what the rules cannot see is decided here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from core.conditions import VERDICT_INFO
from core.slo import Slo
from core.thresholds import COMPARE_NOISE_FLOOR, ROUND_SPREAD_UNSTEADY
from diagnose.decision.calls import (
    AGGREGATE,
    DECODE,
    STEP_ONLY,
    TTFT,
    Call,
    aggregate_stat,
    decode_stat,
    measured_call,
    ttft_stat,
    whole_request_calls,
)
from diagnose.decision.loads import (
    crossover_range,
    level_answers,
    per_load_text,
    recommend,
)
from diagnose.decision.model import (
    FIX_MEMORY_FIRST,
    INCONCLUSIVE,
    NOT_MEASURED,
    Decision,
    EngineResult,
    Estimate,
    LoadAnswer,
    Row,
    Step,
)
from diagnose.decision.one_engine import max_tokens_caveats
from diagnose.decision.requests import EngineRequests
from diagnose.decision.slo import slo_answer, slo_step
from diagnose.decision.sources import ENGINE, ENGINE_NOTE

# Weight bytes per parameter differing by more than this: the raw speeds are not comparable.
PRECISION_TOLERANCE = 0.20

# The noise floor below which no difference is called (kept under its old name).
MIN_DIFFERENCE = COMPARE_NOISE_FLOOR


def _pct(x: float) -> str:
    return f"{x * 100:.0f} %"


@dataclass
class ResidencyNumbers:
    """One engine in compare's residency step."""

    verdict: str | None
    weights_bytes: float | None


@dataclass
class PrecisionNumbers:
    """One engine in compare's comparability step: its precision and share of the roofline."""

    quantization: str | None
    bytes_per_parameter: float | None
    weights_bytes: float | None
    roofline_efficiency: float | None
    roofline_tok_s: float | None
    roofline_misfit: str | None

    @classmethod
    def of(cls, e: EngineResult) -> PrecisionNumbers:
        roof = e.roofline
        return cls(
            e.quantization,
            e.bytes_per_parameter(),
            e.weights_bytes,
            roof.efficiency,
            roof.limit_tok_s,
            roof.misfit,
        )


@dataclass
class ContextNumbers:
    """One engine in compare's long-context step."""

    max_loaded: int | None
    failed: list[int]


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


@dataclass
class CompareInputs:
    """What the compare decision reads besides the two engines' results."""

    requests: dict[str, EngineRequests] | None = None  # per-request samples (requests.jsonl)
    load: int | None = None  # the user's concurrency (--load, or read by --load-from)
    slo: Slo | None = None  # the user's SLO (--slo)
    load_source: str | None = None  # where `load` came from (served_load.ServedLoad.source)


def decide_compare(
    a: EngineResult, b: EngineResult, inputs: CompareInputs | None = None
) -> Decision:
    """`a` is the engine in use, `b` the candidate; in the seed's order."""
    inputs = inputs or CompareInputs()
    reqs = inputs.requests or {e.name: EngineRequests(e.name) for e in (a, b)}
    caveats = max_tokens_caveats(a) + max_tokens_caveats(b)
    caveats += [f"{e.name}: {n}" for e in (a, b) for n in e.notes]
    verdicts = {e.name: e.verdict for e in (a, b)}
    # 1. Residency: an engine whose weights are not on the GPU measures its PCIe link.
    not_resident = [e.name for e in (a, b) if e.verdict == "weights_not_resident"]
    steps = [_residency_step(a, b, not_resident)]
    # 2. Comparability: the same precision, or compare shares of the roofline.
    comparable, why = comparability(a, b)
    ests = estimates(a, b) if not comparable else []
    if not comparable:
        caveats.append(why)
    steps.append(_comparability_step(a, b, comparable, why))
    # 3. Single-request decode and 4. batching at every common concurrency.
    single_call = _single_call(a, b, reqs)
    steps.append(_call_step("decode", "Single-request decode: who is faster?", single_call, a, b))
    batch_calls = _batch_calls(a, b, reqs)
    steps.append(_batching_step(a, b, [x for x in batch_calls if (x.concurrency or 1) > 1]))
    # The answer per load: the whole request at 1 (TTFT + decode, what one user waits for;
    # decode alone without per-request samples, aggregate when both are missing), aggregate
    # tok/s above, but the whole request again where the engine in use is latency-bound.
    # The same whole request at every latency-bound level above 1 (`latency_bound`).
    whole = whole_request_calls(a, b, reqs)
    deciding = [x for x in (*whole, single_call) if x] + [
        x for x in batch_calls if x.what == AGGREGATE
    ]
    levels = level_answers(deciding)
    cross = crossover_range(levels)
    steps.append(_per_load_step(levels, cross))
    # 5. Long context: whose memory gives out first.
    long_step, ctx_winner = _long_context_step(a, b)
    steps.append(long_step)
    slo = slo_answer(inputs.slo, (a, b), reqs) if inputs.slo else None
    if slo is not None:
        steps.append(slo_step(slo))
    if not_resident or not comparable:
        rec, action = _not_decided(a, b, not_resident, ests)
    else:
        rec, action = recommend(a, b, levels, ctx_winner, inputs.load, slo)
    caveats += unsteady_rounds(deciding)
    # The token counts request by request (the same prompt, other tokenizers) come last.
    caveats += token_count_differences(a, b)
    return Decision(
        verdicts,
        rec,
        action,
        comparable,
        steps,
        caveats,
        ests,
        levels,
        cross[1] if cross else None,
        inputs.load,
        slo,
        inputs.load_source,
        cross[0] if cross else None,
    )


def _per_load_step(levels: list[LoadAnswer], cross: tuple[int, int] | None) -> Step:
    if not levels:
        return Step("per_load", "Who is ahead at each load?", NOT_MEASURED + "no common load")
    text = per_load_text(levels)
    if cross is not None:
        text += f"; the answer changes between c={cross[0]} and c={cross[1]}"
    return Step(
        "per_load",
        "Who is ahead at each load, and where does it change?",
        text,
        any(lv.winner for lv in levels),
        {"crossover": cross[1] if cross else None, "crossover_from": cross[0] if cross else None},
    )


def _residency_step(a: EngineResult, b: EngineResult, not_resident: list[str]) -> Step:
    unseen = {e.name: why for e in (a, b) if (why := residency_unseen(e)) is not None}
    if not_resident:
        answer = "no: " + ", ".join(not_resident)
    elif not unseen:
        answer = "yes, on both engines"
    else:
        # A residency that was not measured is not a yes (no GPU seen, an engine not run).
        seen = [e.name for e in (a, b) if e.name not in unseen]
        answer = f"yes on {seen[0]}; " if seen else ""
        answer += NOT_MEASURED + "; ".join(f"{name}: {why}" for name, why in unseen.items())
    return Step(
        "residency",
        "Do the weights fit and stay resident?",
        answer,
        bool(not_resident),
        {e.name: ResidencyNumbers(e.verdict, e.weights_bytes) for e in (a, b)},
    )


def unsteady_rounds(calls: list[Call]) -> list[str]:
    """A caveat for each deciding call whose rounds spread over `ROUND_SPREAD_UNSTEADY`."""
    return [
        f"c={x.concurrency or 1} ({x.what}): the rounds spread {_pct(x.spread)}, over "
        f"{_pct(ROUND_SPREAD_UNSTEADY)}: something besides the engines moved the figures "
        "between rounds (another load on the card or the CPU?); rerun on a quiet host before "
        "acting on this level"
        for x in calls
        if x.spread is not None and x.spread > ROUND_SPREAD_UNSTEADY
    ]


def residency_unseen(e: EngineResult) -> str | None:
    """Why the engine's residency step measured nothing (its own `missing` entry, one that
    covers every step, or no verdict at all); None: it was measured."""
    for entry in e.missing:
        keys, _, why = entry.partition(": ")
        if "residency" in keys.split(", ") or keys == "every step":
            return why
    return "nothing was measured" if e.verdict is None else None


def _share_text(e: EngineResult) -> str:
    """`name N %` of the card's decode limit, or why that share is not known."""
    if e.roofline.misfit is not None:
        return f"{e.name} beyond physics ({e.roofline.misfit}: the roofline does not fit)"
    if e.roofline.efficiency is not None:
        return f"{e.name} {_pct(e.roofline.efficiency)}"
    return f"{e.name} unknown (pass --bandwidth-gbs)"


def _comparability_step(a: EngineResult, b: EngineResult, comparable: bool, why: str) -> Step:
    if not comparable:
        why += ". Share of the card's decode limit: " + ", ".join(_share_text(e) for e in (a, b))
    return Step(
        "comparability",
        "Same precision (weight bytes per parameter within 20 %)?",
        why,
        not comparable,
        {e.name: PrecisionNumbers.of(e) for e in (a, b)},
    )


def _single_call(a: EngineResult, b: EngineResult, reqs: dict[str, EngineRequests]) -> Call | None:
    sa, sb = a.single(), b.single()
    if not (sa and sb):
        return None
    return measured_call(
        DECODE,
        1,
        a,
        b,
        (sa.per_seq_tok_s, sb.per_seq_tok_s),
        (sa.per_seq_rounds, sb.per_seq_rounds),
        (reqs[a.name].rounds(a, sa), reqs[b.name].rounds(b, sb)),
        decode_stat,
        sources=(sa.per_seq_source, sb.per_seq_source),
    )


def _batch_calls(a: EngineResult, b: EngineResult, reqs: dict[str, EngineRequests]) -> list[Call]:
    """Aggregate tok/s and TTFT at every concurrency both engines ran (1 included)."""
    common = sorted(
        {r.concurrency for r in a.ok_rows() if r.step in ("single", "concurrency")}
        & {r.concurrency for r in b.ok_rows() if r.step in ("single", "concurrency")}
    )
    calls: list[Call] = []
    for c in common:
        ra, rb = a.at_concurrency(c), b.at_concurrency(c)
        if ra is None or rb is None:
            continue
        samples = (reqs[a.name].rounds(a, ra), reqs[b.name].rounds(b, rb))
        agg = measured_call(
            AGGREGATE,
            c,
            a,
            b,
            (ra.aggregate_tok_s, rb.aggregate_tok_s),
            (ra.aggregate_rounds, rb.aggregate_rounds),
            samples,
            aggregate_stat([*samples[0], *samples[1]]),
        )
        ttft = measured_call(
            TTFT,
            c,
            a,
            b,
            (ra.ttft_s, rb.ttft_s),
            (ra.ttft_rounds, rb.ttft_rounds),
            samples,
            ttft_stat,
            higher_is_better=False,
            sources=(ra.ttft_source, rb.ttft_source),
        )
        calls += [x for x in (agg, ttft) if x]
    return calls


def _batching_step(a: EngineResult, b: EngineResult, calls: list[Call]) -> Step:
    return Step(
        "batching",
        "At equal load, which engine gives more aggregate tok/s and a shorter TTFT?",
        "; ".join(_call_text(x, a, b) for x in calls)
        if calls
        else NOT_MEASURED + "no common concurrency > 1 with successful requests",
        any(x.winner for x in calls),
        {"calls": list(calls)},
    )


def _long_context_step(a: EngineResult, b: EngineResult) -> tuple[Step, str | None]:
    """The long-context step and the engine whose memory lasts longer (None: neither)."""
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
    step = Step(
        "long_context",
        "Long context: whose memory gives out first?",
        ans,
        ctx_winner is not None,
        {a.name: ContextNumbers(ma, fa), b.name: ContextNumbers(mb, fb)},
    )
    return step, ctx_winner


def _call_text(x: Call, a: EngineResult, b: EngineResult) -> str:
    where = f" at concurrency {x.concurrency}" if x.concurrency else ""
    if x.ratio_lo is not None or x.basis.endswith(STEP_ONLY):
        basis = x.basis
    else:
        basis = f"spread {_pct(x.spread)}" if x.spread is not None else "one round: no spread"
    verdict = f"{x.winner} ahead by {x.lead()}" if x.winner else "no difference beyond the noise"
    # An engine's own timing (the streamed text was empty) says so beside its figure.
    pairs = ((a, x.a_source), (b, x.b_source))
    sources = "".join(f"; {e.name}: {ENGINE_NOTE}" for e, src in pairs if src == ENGINE)
    return f"{x.what}{where}: {x.figures(a.name, b.name)} ({basis}; {verdict}{sources})"


def _call_step(key: str, question: str, x: Call | None, a: EngineResult, b: EngineResult) -> Step:
    if x is None:
        return Step(key, question, NOT_MEASURED + "no single-request row on both engines")
    return Step(key, question, _call_text(x, a, b), x.winner is not None, asdict(x))


def _not_decided(
    a: EngineResult, b: EngineResult, not_resident: list[str], ests: list[Estimate]
) -> tuple[str, str]:
    """Earlier steps that stop the comparison: weights not resident, different precisions."""
    if not_resident:
        who = " and ".join(not_resident)
        # Each engine's own action, the one diagnose prints (`engine_verdict`: expert offload
        # names its layers and bound, never the layers advice when every layer is on the GPU).
        own = [
            (f"{e.name}: " if len(not_resident) > 1 else "")
            + (e.action or VERDICT_INFO["weights_not_resident"].action)
            for e in (a, b)
            if e.name in not_resident
        ]
        return FIX_MEMORY_FIRST, (
            f"fix memory first: the weights of {who} are not all on the GPU, so its speed "
            "measures host memory, not the engine. " + " ".join(own)
        )
    est = "; ".join(f"{e.basis} ≈ {e.tok_s:.1f} tok/s" for e in ests)
    return INCONCLUSIVE, (
        "the engines serve different precisions, so which engine is faster is not "
        "decided by these numbers: run both on the same weights." + (f" {est}." if est else "")
    )


def token_count_differences(a: EngineResult, b: EngineResult) -> list[str]:
    """Differences in prompt/completion token counts between rows of the same step."""
    out = []

    def key(r: Row) -> tuple[str, int, int | None]:
        # Only the context sweep is matched on context: elsewhere it is each engine's default.
        return (r.step, r.concurrency, r.context if r.step == "context" else None)

    rows_b = {key(r): r for r in b.ok_rows()}
    for ra in a.ok_rows():
        rb = rows_b.get(key(ra))
        if rb is None or ra.step == "kv_pressure":
            # The KV step's prompt follows each engine's own slot context.
            continue
        if ra.completion_tokens != rb.completion_tokens:
            out.append(
                f"{ra.step} c={ra.concurrency}: generated tokens differ "
                f"({a.name} {ra.completion_tokens}, {b.name} {rb.completion_tokens})"
            )
        if ra.prompt_tokens and rb.prompt_tokens and abs(ra.prompt_tokens - rb.prompt_tokens) > 0.5:
            out.append(
                f"{ra.step} c={ra.concurrency}: the same prompt is {ra.prompt_tokens:.0f} tokens "
                f"on {a.name} and {rb.prompt_tokens:.0f} on {b.name} (different tokenizers)"
            )
    return out
