"""The overview's prefill row (issue 27): prompts against the card's compute limit, and the
time before the first token split into waiting and the prompt's own work."""

from __future__ import annotations

from core import series as llmb
from core.thresholds import threshold_promql
from mixin.dashboards.panels import RW, SEL, Limit, Row, Target, check, engine_share, ts


def prefill_row() -> Row:
    """Step 6: are long prompts at the card's compute limit, or waiting?"""
    t = {name: threshold_promql(name) for name in (
        "prefill_prompt_tokens_min", "prefill_efficiency_at_limit", "ttft_wait_share_high",
        "decode_efficiency_physical_max",
    )}  # fmt: skip
    return Row(
        "6. Prompts: at the card's compute limit, or waiting?",
        [
            check(
                "Prompts at the card's limit",
                f"engine:llmb_prefill_at_card_limit:bool{{{SEL}}}",
                f"YES when prompts average {t['prefill_prompt_tokens_min']} tokens or more, are "
                f"computed at {t['prefill_efficiency_at_limit']} or more of the card's dense "
                "BF16 peak and barely wait: a faster card, or shorter or cached prompts.",
            ),
            check(
                "Time to first token mostly waiting",
                f"engine:llmb_ttft_waiting:bool{{{SEL}}}",
                f"YES when waiting is {t['ttft_wait_share_high']} or more of the time before "
                "the first token (long prompts): admission and prefill batching, not the "
                "card, set it.",
            ),
            engine_share(
                "Prefill efficiency (measured / compute limit)",
                f"engine:llmb_prefill_efficiency:ratio{RW}",
                Limit("prefill_efficiency_at_limit", "above", bad_color="orange"),
                6,
                # No number beyond physics: above the gate the line stops.
                gate=f"<= {t['decode_efficiency_physical_max']}",
                description=(
                    "Prompt tok/s x FLOPs per prompt token (2 x the active parameters plus "
                    "attention at the mean prompt) / the card's dense BF16 peak. Prompt tok/s "
                    f"(`engine:llmb_prefill_tokens_per_second:rate{RW}`) is the one prefill "
                    "figure `llmb-loadgen diagnose` reports too: prompt tokens computed over the "
                    f"wall time prefill ran (`{llmb.ENGINE_PREFILL_BUSY_SECONDS_TOTAL}`), so "
                    "prompts computed together count once "
                    f"(`engine:llmb_prefill_efficiency:ratio{RW}`). At or above the line "
                    f"(`prefill_efficiency_at_limit` = {t['prefill_efficiency_at_limit']}) "
                    "prompts run at the card's compute limit. Above "
                    f"{t['decode_efficiency_physical_max']} the FLOPs model or the peak does "
                    "not fit, the line stops and no claim is made."
                ),
            ),
            ts(
                "Before the first token: waiting share, prefill time share",
                Target(f"engine:llmb_ttft_wait:ratio{RW}{{{SEL}}}", "wait {{engine}}"),
                Target(f"engine:llmb_prefill_time:ratio{RW}{{{SEL}}}", "prefill {{engine}}"),
                unit="percentunit",
                width=6,
                description=(
                    "wait: average requests waiting / (waiting + in prefill), the share of the "
                    "time before the first token spent waiting (an estimate by Little's law; in "
                    "prefill: each request's own prompt time, so prompts computed together are "
                    "not waiting; diagnose splits each request's TTFT with the engine's own "
                    "prompt time). prefill: prompt "
                    "seconds / (prompt + decode seconds), the share of the engine's time spent "
                    "on prompts."
                ),
            ),
        ],
    )
