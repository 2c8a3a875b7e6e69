"""The prefill roofline and the time before the first token, per engine (issue 27).

Python equivalent: `core.prefill_rules.prefill_values` (same arithmetic, same order); the
parity test ties them.
"""

from __future__ import annotations

from typing import Any

from core import series as llmb
from core.prefill import PEAK_DTYPE
from core.thresholds import threshold_promql
from mixin.rules.card import clock_scaled
from mixin.rules.common import E, mx, rec
from mixin.rules.roofline import engine_gpus_join


def _rate(metric: str) -> str:
    return f"max by ({E}) (rate({metric}[{threshold_promql('rate_window')}]))"


def _names() -> dict[str, str]:
    rw = threshold_promql("rate_window")
    return {
        "prompt": f"engine:llmb_request_prompt_tokens:mean{rw}",
        "peak": "engine:llmb_gpu_peak_flops:max",
        "window": f"engine:llmb_prefill_window_positions:min{rw}",
        "flops": f"engine:llmb_prefill_flops_per_token:avg{rw}",
        "limit": f"engine:llmb_prefill_limit_tokens_per_second:avg{rw}",
    }


def prefill_rules() -> list[dict[str, Any]]:
    """The prefill records in evaluation order (each reads only earlier records)."""
    rw = threshold_promql("rate_window")
    n = _names()
    prompt_s = _rate(llmb.ENGINE_PROMPT_SECONDS_TOTAL)
    waiting = mx(f"avg_over_time({llmb.ENGINE_REQUESTS_WAITING}[{rw}])")
    return [
        rec(
            # Prompt tokens per finished request: the prompt length attention grows with.
            n["prompt"],
            f"""
            {_rate(llmb.ENGINE_PROMPT_TOKENS_TOTAL)}
              / ({_rate(llmb.ENGINE_REQUESTS_FINISHED_TOTAL)} > 0)
            """,
        ),
        # The engine's dense BF16 peak at the SM clock its GPUs ran under load (issue 32),
        # joined to its GPUs as the bandwidth is.
        rec(
            n["peak"],
            engine_gpus_join(
                clock_scaled(f'max by (host, gpu) ({llmb.GPU_PEAK_FLOPS}{{dtype="{PEAK_DTYPE}"}})')
            ),
        ),
        # m = min(P, W): the positions a sliding-window layer sees at the prompt's end.
        rec(
            n["window"],
            f"({n['prompt']} <= {mx(llmb.MODEL_SLIDING_WINDOW_TOKENS)})"
            f" or {mx(llmb.MODEL_SLIDING_WINDOW_TOKENS)}",
        ),
        rec(n["flops"], flops_expr()),
        rec(n["limit"], f"{n['peak']} / ({n['flops']} > 0)"),
        rec(
            f"engine:llmb_prefill_efficiency:ratio{rw}",
            f"engine:llmb_prefill_tokens_per_second:rate{rw} / ({n['limit']} > 0)",
        ),
        rec(
            # Little's law: average requests waiting and average requests in prefill are
            # the mean wait and the mean prefill time times the same arrival rate.
            f"engine:llmb_ttft_wait:ratio{rw}",
            f"""
            {waiting}
              / (({waiting} + {prompt_s}) > 0)
            """,
        ),
        rec(
            f"engine:llmb_prefill_time:ratio{rw}",
            f"""
            {prompt_s}
              / (({prompt_s} + {_rate(llmb.ENGINE_DECODE_SECONDS_TOTAL)}) > 0)
            """,
        ),
    ]


def flops_expr() -> str:
    """FLOPs per prompt token at the mean prompt P: matmuls + full-attention layers x
    (P + 1) / 2 + sliding-window layers x (m(m + 1)/2 + (P - m) m) / P, m = min(P, W)."""
    n = _names()
    p, m = n["prompt"], n["window"]
    matmul = mx(llmb.MODEL_PREFILL_FLOPS_PER_TOKEN)
    full = mx(f'{llmb.MODEL_PREFILL_ATTENTION_FLOPS_PER_POSITION}{{layers="full"}}')
    sliding = mx(f'{llmb.MODEL_PREFILL_ATTENTION_FLOPS_PER_POSITION}{{layers="sliding"}}')
    return f"""
      {matmul}
    + (
        {full} * (({p} + 1) / 2)
      or
        0 * {matmul}
    )
    + (
        {sliding} * (({m} * ({m} + 1) / 2 + ({p} - {m}) * {m}) / {p})
      or
        0 * {matmul}
    )
    """
