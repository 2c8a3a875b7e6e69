# ruff: noqa: E501
"""llama-server's `/metrics`: the families it writes (one line a family) and their values."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.engine import Engine

COUNTER, GAUGE = "counter", "gauge"
PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"

# (name, type, help) in the server's output order; values come from `metric_values`.
# fmt: off
METRICS: tuple[tuple[str, str, str], ...] = (
    ("prompt_tokens_total", COUNTER, "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", COUNTER, "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", COUNTER, "Total time spent processing prompts"),
    ("tokens_predicted_total", COUNTER, "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", COUNTER, "Total time spent generating tokens"),
    ("n_decode_total", COUNTER, "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding"),
    ("n_tokens_max", COUNTER, "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", COUNTER, "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", COUNTER, "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", COUNTER, "Speculative: Total speculative decoding verification steps"),
    ("prompt_tokens_seconds", GAUGE, "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", GAUGE, "Average generation throughput in tokens/s"),
    ("requests_processing", GAUGE, "Number of requests processing"),
    ("requests_deferred", GAUGE, "Number of requests deferred"),
    ("n_busy_slots_per_decode", GAUGE, "Average number of busy slots per llama_decode() call"),
)
# fmt: on


def fmt(value: float) -> str:
    """Format like `std::ostream << double` at precision 6 (1234567 -> 1.23457e+06)."""
    return f"{value:g}"


def metric_values(e: Engine) -> list[float]:
    """The values of `METRICS`, in order; a scrape starts the throughput gauges' next window."""
    st = e.stats
    prompt_tps = st.win_prompt_tokens / st.win_prompt_seconds if st.win_prompt_seconds else 0.0
    pred_tps = st.win_pred_tokens / st.win_pred_seconds if st.win_pred_seconds else 0.0
    # The two throughput gauges cover the window since the previous scrape.
    st.win_prompt_tokens = st.win_pred_tokens = 0
    st.win_prompt_seconds = st.win_pred_seconds = 0.0
    busy = st.busy_slot_sum / st.n_decode if st.n_decode else 0.0
    return [
        st.prompt_tokens,
        st.prompt_cached,
        st.prompt_seconds,
        st.predicted_tokens,  # added when a request ends, as the server does
        st.predicted_seconds,
        st.n_decode,
        st.n_tokens_max,
        st.spec_draft_tokens,
        st.spec_accepted,
        st.spec_drafts,
        prompt_tps,
        pred_tps,
        len(e.running),
        # Deferred: tasks with no free slot. A request that arrived during a step and
        # takes a free slot at the next one was never parked in the deferred queue.
        max(0, len(e.waiting) - sum(1 for s in e.slots if s.request is None)),
        busy,
    ]


def render(e: Engine) -> str:
    """The `/metrics` text."""
    lines = []
    for (name, mtype, help_text), value in zip(METRICS, metric_values(e), strict=True):
        lines.append(f"# HELP llamacpp:{name} {help_text}")
        lines.append(f"# TYPE llamacpp:{name} {mtype}")
        lines.append(f"llamacpp:{name} {fmt(value)}")
    per_pos = e.stats.spec_accepted_per_pos
    if per_pos and e.stats.spec_drafts:
        lines.append(f"# HELP {PER_POS} Accepted tokens per draft position")
        lines.append(f"# TYPE {PER_POS} counter")
        lines += [f'{PER_POS}{{position="{i}"}} {fmt(n)}' for i, n in enumerate(per_pos)]
    return "\n".join(lines) + "\n"
