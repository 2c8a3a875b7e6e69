"""The prefill roofline: FLOPs per prompt token, the card's compute limit, the physics gate.

A prompt is compute-bound: each prompt token multiplies through the weights it routes to
(2 FLOPs per active parameter: the always-read weights and k of E routed experts; the
token embedding is a lookup and the output projection runs for the last token only) and
attends to the positions before it (2 x heads x (key + value head size) FLOPs per layer and
position; a sliding-window layer at most its window). Same arithmetic as the recording
rules `engine:llmb_prefill_flops_per_token:avg<rate_window>` and
`engine:llmb_prefill_efficiency:ratio<rate_window>` (mixin/rules/prefill.py).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass

from core.roofline import decode_efficiency, known_ratio
from core.thresholds import threshold_number, threshold_promql

# The peak the prefill roofline uses: dense BF16/FP16 tensor FLOP/s (`llmb_gpu_peak_flops`).
PEAK_DTYPE = "bf16"


@dataclass(frozen=True)
class PrefillStructure:
    """What the prefill roofline knows about a model's FLOPs per prompt token.

    `matmul_flops`: 2 x the parameters one prompt token multiplies through (MoE: the
    always-read weights plus k/E of the routed experts). `attention_flops_full`: FLOPs per
    token and per attended position summed over the full-attention layers;
    `attention_flops_swa` the same over the sliding-window layers, which attend to at most
    `sliding_window` positions.
    """

    matmul_flops: float
    attention_flops_full: float = 0.0
    attention_flops_swa: float = 0.0
    sliding_window: float | None = None


def attended_positions(prompt_tokens: float, window: float | None = None) -> float:
    """Mean positions a prompt token attends to (causal, itself included) in a prompt of
    `prompt_tokens`: (P + 1) / 2, or with a window W: (m(m + 1)/2 + (P - m) m) / P with
    m = min(P, W). Same order of operations as the rules' PromQL."""
    if window is None:
        return (prompt_tokens + 1) / 2
    if not prompt_tokens:
        return math.nan  # 0 / 0, as in PromQL
    m = min(prompt_tokens, window)
    return (m * (m + 1) / 2 + (prompt_tokens - m) * m) / prompt_tokens


def prefill_flops_per_token(model: PrefillStructure, prompt_tokens: float | None) -> float:
    """FLOPs one prompt token costs in a prompt of `prompt_tokens` (weights only if None)."""
    total = model.matmul_flops
    if prompt_tokens is None or math.isnan(prompt_tokens):
        return total
    total = total + model.attention_flops_full * attended_positions(prompt_tokens)
    if model.attention_flops_swa and model.sliding_window:
        swa = attended_positions(prompt_tokens, model.sliding_window)
        total = total + model.attention_flops_swa * swa
    return total


def prefill_limit_tokens_per_second(
    peak_flops: float | None, flops_per_token: float | None
) -> float | None:
    """The card's prefill limit: peak FLOP/s / FLOPs per prompt token (None if unknown)."""
    return known_ratio(peak_flops, flops_per_token)


def prefill_efficiency(measured_tok_s: float | None, limit_tok_s: float | None) -> float | None:
    """Measured prompt tok/s / the card's prefill limit (None when either is unknown): the
    decode's measured-over-limit ratio."""
    return decode_efficiency(measured_tok_s, limit_tok_s)


def prefill_physical(efficiency: float | None) -> bool:
    """Whether a prefill efficiency is within physics: the decode gate's bound (absent: fine).

    Above it the FLOPs model or the peak does not fit (a wrong dtype's peak, a model whose
    structure is unknown, a prompt served from the cache): a misfit, never a verdict.
    """
    return efficiency is None or efficiency <= threshold_number("decode_efficiency_physical_max")


def prefill_misfit_text(efficiency: float) -> str:
    """One sentence for every surface: no prefill claim beyond physics, and why."""
    gate = threshold_number("decode_efficiency_physical_max")
    return (
        f"no prefill claim: {efficiency * 100:.0f} % of the card's compute limit is above "
        f"{gate * 100:.0f} % (beyond physics). Likely cause: "
        "the peak is for another dtype (pass --peak-tflops), prompt tokens served from the "
        "prefix cache, or the model's structure is unknown"
    )


def busy_seconds(spans: Iterable[tuple[float, float]]) -> float:
    """The wall time in which any prompt was being computed: the length of the union of the
    prompt spans [start, end]. Prompts computed together in one batch count once."""
    total, end = 0.0, -math.inf
    for lo, hi in sorted(spans):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def prefill_tokens_per_second(tokens: float | None, busy_s: float | None) -> float | None:
    """THE prefill throughput: prompt tokens computed (cache hits left out) over the wall time
    in which prefill ran (`busy_seconds`; the counter `llmb_engine_prefill_busy_seconds_total`).
    Diagnose, the rules, the report and the dashboard all show this figure. None when either
    is unknown or no prefill ran."""
    if tokens is None or busy_s is None or not busy_s > 0:
        return None
    return tokens / busy_s


class PrefillBusy:
    """The running union of prompt spans, as a counter: `add` returns the seconds a new span
    adds to the time in which prefill ran (its part outside every span seen before).

    Spans arrive when their requests end, so out of order; the ones ending more than
    `horizon_s` before the latest are forgotten (a span that old counts in full). Each `add`
    touches only the spans it overlaps (the union is kept sorted and disjoint).
    """

    def __init__(self, horizon_s: float = 3600.0) -> None:
        self.horizon_s = horizon_s
        self.total = 0.0
        self._merged: list[tuple[float, float]] = []

    def add(self, start: float, end: float) -> float:
        """Count the span [start, end]; the seconds it added."""
        if not end > start:
            return 0.0
        spans = self._merged
        i = bisect.bisect_left(spans, (start, -math.inf))
        if i > 0 and spans[i - 1][1] >= start:
            i -= 1
        j, covered, lo, hi = i, 0.0, start, end
        while j < len(spans) and spans[j][0] <= end:
            covered += min(spans[j][1], end) - max(spans[j][0], start)
            lo, hi = min(lo, spans[j][0]), max(hi, spans[j][1])
            j += 1
        spans[i:j] = [(lo, hi)]
        # Disjoint and sorted by start, so sorted by end too: the latest ends last.
        del spans[: bisect.bisect_left(spans, spans[-1][1] - self.horizon_s, key=_end)]
        added = max(0.0, (end - start) - covered)
        self.total += added
        return added


def _end(span: tuple[float, float]) -> float:
    return span[1]


def ttft_wait_share(wait: float | None, prefill: float | None) -> float | None:
    """wait / (wait + prefill): the share of the time before the first token spent waiting.

    The rules take both as Little's-law occupancies (average requests waiting, average
    requests in prefill: `rate(prompt_seconds)`), which is the same ratio of mean times.
    """
    if wait is None or prefill is None:
        return None
    return known_ratio(wait, wait + prefill)


# The prefill conditions of the core's table (core/conditions.py): (name, evidence label,
# comparisons (signal, op, threshold) that must all hold). Long prompts in each; no answer
# beyond physics (the decode's gate).
LONG_PROMPTS = ("prompt_tokens_mean", ">=", "prefill_prompt_tokens_min")
# Its negation: decode at the card's limit holds with short prompts whatever the time share.
SHORT_PROMPTS = ("prompt_tokens_mean", "<", "prefill_prompt_tokens_min")
CONDITION_TESTS: tuple[tuple[str, str, tuple[tuple[str, str, str], ...]], ...] = (
    (
        "ttft_waiting",
        "wait_share",
        (LONG_PROMPTS, ("ttft_wait_share", ">=", "ttft_wait_share_high")),
    ),
    (
        "prefill_at_card_limit",
        "efficiency",
        (
            LONG_PROMPTS,
            ("prefill_efficiency", ">=", "prefill_efficiency_at_limit"),
            ("prefill_efficiency", "<=", "decode_efficiency_physical_max"),
            ("ttft_wait_share", "<", "ttft_wait_share_low"),
        ),
    ),
    (
        "prefill_bound",
        "time_share",
        (LONG_PROMPTS, ("prefill_time_share", ">=", "prefill_time_share_high")),
    ),
)
# Their verdicts: (name, condition, fleet severity).
VERDICT_ROWS = (
    ("ttft_waiting_bound", "ttft_waiting", 4),
    ("prefill_at_card_limit", "prefill_at_card_limit", 2),
    ("prefill_below_card_limit", "prefill_bound", 3),
)

# The prefill conditions' evidence texts and the verdicts' (summary, action), for the core's
# table (core/conditions.py).
TEXT: dict[str, str] = {
    "ttft_waiting": "long prompts (>= `prefill_prompt_tokens_min` tokens per request) and "
    "waiting for admission >= `ttft_wait_share_high` of the time before the first token "
    "(an estimate by Little's law: average requests waiting / (waiting + in prefill, each "
    "request's own prompt time), `rate_window`)",
    "prefill_at_card_limit": "long prompts, prefill efficiency (prompt tok/s x FLOPs per "
    "token / the card's dense BF16 peak) >= `prefill_efficiency_at_limit` and <= "
    "`decode_efficiency_physical_max`, waiting < `ttft_wait_share_low` of the time before the "
    "first token",
    "prefill_bound": "long prompts and prompt seconds >= `prefill_time_share_high` of prompt "
    "+ decode seconds (`rate_window`): computing prompts, not decoding, takes the time",
}
_AT_LIMIT = threshold_promql("prefill_efficiency_at_limit")
VERDICT_TEXT: dict[str, tuple[str, str]] = {
    "ttft_waiting_bound": (
        "The time to the first token is mostly waiting for admission, not computing the "
        "prompt: other requests' prompts or a full set of slots hold new ones back.",
        "Admit and batch prompts sooner: with running requests at their cap let more run at "
        "once (llama.cpp `-np` with `-c` raised, SGLang `--max-running-requests`); below it, "
        "prefill more per step (SGLang chunked prefill: a larger `--chunked-prefill-size` or "
        "`--max-prefill-tokens`; llama.cpp larger `-b`/`-ub`); or send fewer long prompts at "
        "once.",
    ),
    "prefill_at_card_limit": (
        f"Prompts are computed at {_AT_LIMIT} or more of the card's "
        "compute limit with little waiting: the card is the limit for prompts.",
        "The card is the limit for prompts: a faster card, or shorter or cached prompts "
        "(prefix caching: llama.cpp `cache_prompt`, SGLang's radix cache with shared "
        "prefixes).",
    ),
    "prefill_below_card_limit": (
        f"Long prompts take most of the engine's time, below {_AT_LIMIT} "
        "of the card's compute limit (or with no limit known): prefill, not decode, sets the "
        "speed.",
        "Tune prefill: flash attention (llama.cpp `-fa on`), larger prompt batches "
        "(llama.cpp `-b`/`-ub`, SGLang `--chunked-prefill-size`), a compute-friendlier "
        "quantization; or shorter or cached prompts.",
    ),
}
