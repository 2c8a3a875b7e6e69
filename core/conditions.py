"""The conditions and verdicts as data, and `evaluate`: the one function that decides the verdict.

The Prometheus rules are generated from the same `CONDITIONS` (mixin); nothing else
evaluates them. The table is written in core/predicates.py's condition language, whose
absence mirrors PromQL's.
"""

from __future__ import annotations

from dataclasses import dataclass

from core import card_causes as card
from core import prefill
from core.predicates import AllOf, Compare, Condition, ConditionResult, Evidence
from core.signals import Signals
from core.thresholds import threshold_promql

# --- admission on SGLang (issue 18): the limit that binds while requests wait -------------
POOL_ACTION = (
    "The KV pool, not the running-request cap, limits admission: give it more tokens (SGLang "
    "a higher `--mem-fraction-static`, or a larger or no `--max-total-tokens`; llama.cpp a "
    "larger `-c`), store it smaller (`--kv-cache-dtype fp8_e5m2`, `-ctk q8_0 -ctv q8_0`), "
    "or send shorter requests (prompt + max_tokens)."
)
SLOTS_FULL_ACTION = (
    "Running requests sit at their cap: let more run at once (SGLang "
    "`--max-running-requests`, llama.cpp `-np` with `-c` raised so each slot keeps its "
    "context); check the KV cache still has room afterwards."
)
PREFILL_ACTION = (
    "Requests wait for prefill while running stays below its cap and the KV pool has room: "
    "prefill more per step (SGLang a larger `--chunked-prefill-size` or "
    "`--max-prefill-tokens`, llama.cpp larger `-b`/`-ub`) or send shorter prompts."
)


# --- residency: an action per cause, so that none advises what already holds (issue 27) ----
LAYERS_ACTION = (
    "Put every layer on the GPU: llama.cpp `-ngl 999` (and `--fit off` if the automatic "
    "fit lowered `-ngl`), SGLang without `--cpu-offload-gb`. If the weights do not fit, "
    "free memory for them with a shorter context (`-c`, `--context-length`), a "
    "quantized KV cache (`-ctk q8_0 -ctv q8_0`) or a smaller quantization."
)
EXPERTS_HOST_ACTION = (
    "Keep fewer experts on the host (a lower llama.cpp `--n-cpu-moe`, or no `-ot exps=CPU`) "
    "if VRAM allows; to make room, a shorter context (`-c`), a quantized KV cache "
    "(`-ctk q8_0 -ctv q8_0`) or a smaller quantization so they fit on the GPU."
)


# Requests queue: at least `queue_min` waiting on average over `queue_window`.
_QUEUED = Compare("waiting_avg", ">=", "queue_min")


def _decode_at_limit(*more: Compare) -> AllOf:
    """Decode at the roofline (no answer beyond physics: above the physical maximum the
    roofline does not fit), and `more`."""
    return AllOf.of(
        Compare("decode_efficiency", ">=", "decode_efficiency_at_limit"),
        Compare("decode_efficiency", "<=", "decode_efficiency_physical_max"),
        *more,
    )


def _waiting_below_cap(*more: Compare) -> AllOf:
    """Requests queue while running stays below its cap, and `more`."""
    return AllOf.of(
        _QUEUED,
        Compare("running_slots_ratio", "<", "slots_full_ratio"),
        *more,
    )


# The engine-side conditions; `CONDITIONS` (below) holds all of them in decision order.
_ENGINE_CONDITIONS: tuple[Condition, ...] = (
    Condition(
        "weights_not_resident",
        (
            Evidence(
                "layers",
                Compare("layers_ratio", "<", "layers_ratio_min"),
                "fewer layers on the GPU than the model has",
                LAYERS_ACTION,
            ),
            Evidence(
                "buffers",
                Compare("weights_buffers_ratio", "<", "weights_buffer_ratio_min"),
                "GPU weight buffers below `weights_buffer_ratio_min` x weight bytes",
            ),
            Evidence(
                "memory_beyond_kv",
                Compare("weights_memory_beyond_kv_ratio", "<", "weights_memory_ratio_min"),
                "SGLang: engine process GPU memory minus its KV pool (reported, else "
                "`max_total_num_tokens` x KV bytes per token) below `weights_memory_ratio_min` "
                "x weight bytes",
            ),
            Evidence(
                "memory",
                Compare("weights_memory_ratio", "<", "weights_memory_ratio_min"),
                "engine process GPU memory below `weights_memory_ratio_min` x weight bytes",
            ),
            Evidence(
                "experts_host",
                Compare("experts_host_layers", ">", "0"),
                "routed experts of some layers kept in host memory (llama.cpp `--n-cpu-moe`, "
                "`--cpu-moe`, `-ot exps=CPU`)",
                EXPERTS_HOST_ACTION,
            ),
        ),
        needs_gpu=True,
    ),
    Condition(
        "kv_saturated",
        (
            Evidence(
                "usage_and_queue",
                AllOf.of(Compare("kv_usage_avg", ">=", "kv_usage_high"), _QUEUED),
                "KV usage >= `kv_usage_high` with >= `queue_min` requests waiting "
                "(averages over `queue_window`)",
            ),
            Evidence(
                "pressure_events",
                Compare("kv_pressure_increase", ">", "0"),
                "any KV-pressure event (KV full, context shift/exceeded, truncation, "
                "retraction) in `rate_window`",
            ),
            Evidence(
                "pool_held",
                _waiting_below_cap(Compare("kv_demand_held_ratio", ">=", "kv_demand_full")),
                ">= `queue_min` requests waiting while running peaks below `slots_full_ratio` "
                "of its cap, and the KV the running requests hold at the pool's fullest plus one "
                "more of their size "
                "reaches `kv_demand_full` x the pool",
                POOL_ACTION,
            ),
            Evidence(
                "pool_reserved",
                _waiting_below_cap(Compare("kv_demand_finished_ratio", ">=", "kv_demand_full")),
                ">= `queue_min` requests waiting while running peaks below `slots_full_ratio` "
                "of its cap, and (peak running + 1) x the tokens of a finished request (prompt + "
                "answer, `rate_window`) reaches `kv_demand_full` x the pool",
                POOL_ACTION,
            ),
        ),
    ),
    Condition(
        "requests_queueing",
        (
            Evidence(
                "queue",
                _QUEUED,
                ">= `queue_min` requests waiting (average over `queue_window`)",
            ),
            Evidence(
                "slots_full",
                AllOf.of(_QUEUED, Compare("running_slots_ratio", ">=", "slots_full_ratio")),
                "with running peaking at `slots_full_ratio` or more of its cap (`queue_window`)",
                SLOTS_FULL_ACTION,
            ),
            Evidence(
                "prefill",
                _waiting_below_cap(),
                "with running peaking below `slots_full_ratio` of its cap (and the KV pool not "
                "the limit: then `kv_saturated` holds first)",
                PREFILL_ACTION,
            ),
        ),
    ),
    Condition(
        "idle",
        (
            Evidence(
                "no_work",
                AllOf.of(
                    Compare("running", "==", "0"),
                    Compare("waiting", "==", "0"),
                    Compare("generation_tokens_per_second", "==", "0", absent_holds=True),
                ),
                "nothing running, nothing waiting, no tokens generated in `rate_window`",
            ),
        ),
    ),
    Condition(
        "decode_at_card_limit",
        (
            Evidence(
                "efficiency",
                _decode_at_limit(
                    Compare("prefill_time_share", "<", "prefill_time_share_high", absent_holds=True)
                ),
                "decode efficiency (per-sequence decode tok/s / roofline) >= "
                "`decode_efficiency_at_limit` and <= `decode_efficiency_physical_max` "
                "(above it the bytes-per-step model does not fit the measurement: "
                "`llmb:engine_roofline:misfit` says why, and no decode claim is made), and "
                "prompt seconds below `prefill_time_share_high` of prompt + decode seconds "
                "(when long prompts take most of the time, the prefill verdicts say so)",
            ),
            Evidence(
                "efficiency_short_prompts",
                _decode_at_limit(
                    Compare(*prefill.SHORT_PROMPTS, absent_holds=True),
                ),
                "decode efficiency within the same bounds with short prompts (below "
                "`prefill_prompt_tokens_min` tokens per request: no prefill verdict can hold)",
            ),
        ),
    ),
)


# --- the card's own state (issues 27, 32): a slowed card, not the engine, sets the speed --
def _card_test(*tests: card.Test) -> AllOf:
    """These hold, the lost clock explains enough of the gap and decode is below the limit."""
    return AllOf.of(
        *(Compare(*t) for t in tests),
        Compare(*card.EXPLAINS),
        Compare("decode_efficiency", "<", "decode_efficiency_at_limit", absent_holds=True),
    )


CARD_CONDITIONS: tuple[Condition, ...] = (
    Condition(
        "card_throttled",
        tuple(
            Evidence(label, _card_test(*tests), text, action)
            for label, tests, text, action in card.EVIDENCE
        ),
        needs_gpu=True,
    ),
)
# Prefill and the time to the first token (issue 27); tests, texts: core/prefill.py.
PREFILL_CONDITIONS: tuple[Condition, ...] = tuple(
    Condition(n, (Evidence(lab, AllOf(tuple(Compare(*c) for c in tests)), prefill.TEXT[n]),))
    for n, lab, tests in prefill.CONDITION_TESTS
)
_ALL_CONDITIONS = _ENGINE_CONDITIONS + CARD_CONDITIONS + PREFILL_CONDITIONS
CONDITION_BY_NAME: dict[str, Condition] = {c.name: c for c in _ALL_CONDITIONS}

# ------------------------------------------------------------------------------ verdicts


@dataclass(frozen=True)
class VerdictInfo:
    """One verdict: the condition that decides it (None: the fallback), what it means,
    what to do, and its fleet severity (higher is worse)."""

    name: str
    condition: str | None
    summary: str
    action: str
    severity: int


# The card's own state (issue 27); the action is the held evidence's (power, thermal, clocks).
CARD_THROTTLED = VerdictInfo("card_throttled", "card_throttled", *card.VERDICT_TEXT, 3)

# Decision order: the first verdict whose condition holds wins.
VERDICTS: tuple[str, ...] = (
    "weights_not_resident",
    "kv_saturated",
    "ttft_waiting_bound",
    "scheduling_bound",
    "idle",
    "card_throttled",
    "prefill_at_card_limit",
    "decode_at_card_limit",
    "prefill_below_card_limit",
    "decode_below_card_limit",
)

VERDICT_INFO: dict[str, VerdictInfo] = {
    v.name: v
    for v in (
        VerdictInfo(
            "weights_not_resident",
            "weights_not_resident",
            "Part of the model's weights is not on the GPU: every decode step waits for the "
            "part in host memory.",
            LAYERS_ACTION,
            6,
        ),
        VerdictInfo(
            "kv_saturated",
            "kv_saturated",
            "The KV cache is full: requests wait for KV space or are cut (context shift, "
            "truncation, context exceeded, retraction).",
            "Give the KV cache room: a larger context per slot (llama.cpp `-c` with `-np`, "
            "or `--kv-unified`; SGLang `--mem-fraction-static`), a quantized KV cache "
            "(llama.cpp `-ctk q8_0 -ctv q8_0`, SGLang `--kv-cache-dtype fp8_e5m2`), or fewer "
            "or shorter requests at once.",
            5,
        ),
        VerdictInfo(
            "scheduling_bound",
            "requests_queueing",
            "Requests queue while the KV cache has room: the number of slots or running "
            "requests, or prefill, is the limit, not memory.",
            "Find the limit that binds: with running requests at their cap let more run at "
            "once (llama.cpp `-np` with `-c` raised so each slot keeps its context, SGLang "
            "`--max-running-requests`); below the cap prefill is the limit (SGLang "
            "`--chunked-prefill-size`, llama.cpp `-b`/`-ub`).",
            4,
        ),
        *(VerdictInfo(n, c, *prefill.VERDICT_TEXT[n], sev) for n, c, sev in prefill.VERDICT_ROWS),
        VerdictInfo(
            "idle",
            "idle",
            "Nothing running, nothing waiting and no tokens generated in the rate window.",
            "Nothing to fix: send load (`llmb-loadgen run`) to see where it slows down.",
            1,
        ),
        CARD_THROTTLED,
        VerdictInfo(
            "decode_at_card_limit",
            "decode_at_card_limit",
            f"Decode runs at {threshold_promql('decode_efficiency_at_limit')} or more of the "
            "card's memory-bandwidth roofline: the card is the limit.",
            "Read fewer bytes per token (a smaller quantization, a quantized KV cache, shorter "
            "contexts), batch more requests per step, or use a card with more memory "
            "bandwidth; another engine gains little on decode.",
            2,
        ),
        VerdictInfo(
            "decode_below_card_limit",
            None,
            f"Decode runs below {threshold_promql('decode_efficiency_at_limit')} of the card's "
            "roofline (or no roofline is known, or it does not fit the measurement: efficiency "
            f"above {threshold_promql('decode_efficiency_physical_max')}, see "
            "`llmb:engine_roofline:misfit`) with no queue and no memory problem: the engine or "
            "its settings set the speed.",
            "Tune the engine: flash attention (llama.cpp `-fa on`), CUDA graphs, batch sizes "
            "(`-b`, `-ub`), a faster kernel for this quantization; or compare another engine "
            "on the same weights (`llmb-loadgen compare`).",
            3,
        ),
    )
}

# The condition table in decision order, as the rules render it.
CONDITIONS = tuple(CONDITION_BY_NAME[c] for v in VERDICTS if (c := VERDICT_INFO[v].condition))

# Worst first, for fleet views: an engine that is down ranks above every verdict.
SEVERITY: dict[str, int] = {"engine_down": 7} | {v: VERDICT_INFO[v].severity for v in VERDICTS}


@dataclass(frozen=True)
class Verdict:
    """The decision for one engine: the verdict, every condition's result, the evidence."""

    name: str
    conditions: tuple[ConditionResult, ...]
    evidence: tuple[str, ...]

    @property
    def info(self) -> VerdictInfo:
        """Summary, action and severity of this verdict."""
        return VERDICT_INFO[self.name]

    @property
    def action(self) -> str:
        """What to do: the first held evidence's own action, else the verdict's."""
        cond = self.info.condition
        if cond is not None:
            for alt in CONDITION_BY_NAME[cond].alternatives:
                if alt.action is not None and alt.label in self.evidence:
                    return alt.action
        return self.info.action

    @property
    def summary(self) -> str:
        """What the verdict means, in one sentence."""
        return self.info.summary

    def held(self, condition: str) -> bool:
        """Whether the named condition held."""
        return any(c.held for c in self.conditions if c.name == condition)

    def condition(self, name: str) -> ConditionResult:
        """The named condition's result."""
        return next(c for c in self.conditions if c.name == name)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: verdict, evidence, every condition (held or not), summary, action."""
        return {
            "verdict": self.name,
            "evidence": list(self.evidence),
            "conditions": {c.name: c.held for c in self.conditions},
            "summary": self.summary,
            "action": self.action,
        }


def evaluate(signals: Signals) -> Verdict:
    """The verdict the rules give an engine that is up with these signals."""
    results = tuple(c.evaluate(signals) for c in CONDITIONS)
    by_name = {r.name: r for r in results}
    for name in VERDICTS:
        cond = VERDICT_INFO[name].condition
        if cond is None:
            return Verdict(name, results, ())
        if by_name[cond].held:
            return Verdict(name, results, by_name[cond].evidence)
    raise AssertionError("VERDICTS must end with a fallback verdict")  # pragma: no cover
