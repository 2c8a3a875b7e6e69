"""The card's own state (issues 27, 32): per GPU, then per engine over the GPUs it holds.

Python equivalent: `core.card_rules.card_values` (the parity test ties them). Evaluated after
llmb-gpu (it joins `engine_gpu:llmb_gpu_process_memory_used_bytes:sum`) and before
llmb-roofline (the bandwidth rule reads the memory clock ratio); `shortfall_rule` closes
llmb-roofline (it reads the decode and prefill efficiencies).
"""

from __future__ import annotations

from typing import Any

from core import card, card_causes
from core import series as llmb
from core.predicates import Compare
from core.prefill import LONG_PROMPTS
from core.signals import SIGNAL_RECORDS
from core.thresholds import THRESHOLDS, threshold_promql
from mixin.rules.common import E, rec

GPU_SM = SIGNAL_RECORDS["sm_clock_ratio"].replace("engine:", "gpu:", 1)


def gpu_names() -> dict[str, str]:
    """Per-GPU records: power and thermal slowdown shares, SM and memory clock ratios (the
    per-engine records' names with `gpu:`)."""
    per_gpu = {
        short: SIGNAL_RECORDS[signal].replace("engine:", "gpu:", 1)
        for short, signal in (
            ("power", "card_power_slowdown"),
            ("thermal", "card_thermal_slowdown"),
            ("sm", "sm_clock_ratio"),
            ("brake", "card_brake_slowdown"),
            ("limit", "power_limit_ratio"),
        )
    }
    return per_gpu | {"memory": f"gpu:llmb_gpu_memory_clock:ratio{threshold_promql('rate_window')}"}


def _held(reasons: tuple[str, ...]) -> str:
    """Per series, the busy samples of `rate_window` each of `reasons` was active in; HW
    slowdown's less those HW thermal slowdown explains (`core.card.HW_SLOWDOWN_EXPLAINED_BY`),
    never below 0."""
    rw, reason = threshold_promql("rate_window"), llmb.GPU_CLOCK_EVENT_REASON_ACTIVE
    own = [r for r in reasons if r != card.HW_SLOWDOWN]
    text = f'sum_over_time({reason}{{reason=~"{"|".join(own)}"}}[{rw}])'
    if card.HW_SLOWDOWN not in reasons:
        return text
    hw = f'sum_over_time({reason}{{reason="{card.HW_SLOWDOWN}"}}[{rw}])'
    by = f'sum_over_time({reason}{{reason="{card.HW_SLOWDOWN_EXPLAINED_BY}"}}[{rw}])'
    return f"""
        {text}
      or
        clamp_min({hw} - ignoring (reason) ({by} or ignoring (reason) 0 * {hw}), 0)
    """


def _share(reasons: tuple[str, ...]) -> str:
    """Of the samples in which the GPU was busy (not `gpu_idle`), the share in which the most
    persistent of `reasons` was active, per GPU: idle gaps between requests do not dilute it."""
    rw, reason = threshold_promql("rate_window"), llmb.GPU_CLOCK_EVENT_REASON_ACTIVE
    idle = f'{reason}{{reason="{card.IDLE_REASON}"}}[{rw}]'
    return f"""
    clamp_max(
        max by (host, gpu) ({_held(reasons)})
      / (
            max by (host, gpu) (count_over_time({idle}) - sum_over_time({idle}))
          > 0
        ),
      1
    )
    """


def _per_engine(record: str, agg: str) -> str:
    """`agg` over the GPUs an engine's processes hold, with the engine's labels."""
    return f"""
    {agg} by ({E}) (
        (
            {record}
          * on (host, gpu) group_right ()
            (0 * engine_gpu:llmb_gpu_process_memory_used_bytes:sum + 1)
        )
      * on (host, engine) group_left (kind) group by ({E}) ({llmb.ENGINE_UP})
    )
    """


def card_rules() -> list[dict[str, Any]]:
    """The llmb-card group, in evaluation order."""
    rw = threshold_promql("rate_window")
    gpu = gpu_names()
    # Every sample of the window said GPU idle: its clocks drop by design.
    idle = (
        f"max by (host, gpu) (min_over_time({llmb.GPU_CLOCK_EVENT_REASON_ACTIVE}"
        f'{{reason="{card.IDLE_REASON}"}}[{rw}])) == 1'
    )
    return [
        rec(gpu["power"], _share(card.POWER_REASONS)),
        rec(gpu["thermal"], _share(card.THERMAL_REASONS)),
        rec(
            # The mean SM clock of the busy samples against the maximum: the exporter writes
            # `llmb_gpu_sm_clock_busy_hertz` only while the GPU is busy, so the idle samples
            # around the requests (boost clock, no work) do not hide a clock held down under
            # load. Absent without a busy sample.
            gpu["sm"],
            f"""
              max by (host, gpu) (avg_over_time({llmb.GPU_SM_CLOCK_BUSY_HERTZ}[{rw}]))
            / (max by (host, gpu) ({llmb.GPU_SM_CLOCK_MAX_HERTZ}) > 0)
            """,
        ),
        rec(
            # The roofline's bandwidth scales with the memory clock the window reached; not
            # while the GPU was idle throughout (GDDR cards drop their memory clock then).
            gpu["memory"],
            f"""
            clamp_max(
                max by (host, gpu) (max_over_time({llmb.GPU_MEMORY_CLOCK_HERTZ}[{rw}]))
              / (max by (host, gpu) ({llmb.GPU_MEMORY_CLOCK_MAX_HERTZ}) > 0),
              1
            )
            unless on (host, gpu)
              {idle}
            """,
        ),
        rec(gpu["brake"], _share(card.BRAKE_REASONS)),
        rec(
            # Below the default someone lowered it (`nvidia-smi -pl`, a host or BMC cap).
            gpu["limit"],
            f"""
              max by (host, gpu) ({llmb.GPU_POWER_LIMIT_WATTS})
            / (max by (host, gpu) ({llmb.GPU_POWER_LIMIT_DEFAULT_WATTS}) > 0)
            """,
        ),
        rec(SIGNAL_RECORDS["card_power_slowdown"], _per_engine(gpu["power"], "max")),
        rec(SIGNAL_RECORDS["card_thermal_slowdown"], _per_engine(gpu["thermal"], "max")),
        # The slowest GPU sets the pace of a step spread over several.
        rec(SIGNAL_RECORDS["sm_clock_ratio"], _per_engine(gpu["sm"], "min")),
        rec(SIGNAL_RECORDS["card_brake_slowdown"], _per_engine(gpu["brake"], "max")),
        # The most lowered limit of the engine's GPUs.
        rec(SIGNAL_RECORDS["power_limit_ratio"], _per_engine(gpu["limit"], "min")),
        rec(SIGNAL_RECORDS["memory_clock_ratio"], _per_engine(gpu["memory"], "min")),
    ]


def clock_scaled(per_gpu_peak: str) -> str:
    """`core.card.clock_scaled_peak` per GPU: the peak x the SM clock ratio under load where
    it is below 1 (prefill's compute roofline at the clock the card ran)."""
    return f"""
    ({per_gpu_peak})
      * on (host, gpu) group_left ()
        (({GPU_SM} < 1) or on (host, gpu) (0 * ({per_gpu_peak}) + 1))
    """


def shortfall_rule() -> dict[str, Any]:
    """`core.card.shortfall_explained`: (1 - the lower of the SM and memory clock ratios) /
    (1 - the lowest of decode and prefill efficiency at the maximum clocks; prefill's with
    long prompts only), the gap 1 without either (or at or beyond the roofline), at most 1."""
    sm = SIGNAL_RECORDS["sm_clock_ratio"]
    memory = SIGNAL_RECORDS["memory_clock_ratio"]
    # Each efficiency against the maximum clocks' roofline (theirs scale with the clocks).
    rec_prefill = SIGNAL_RECORDS["prefill_efficiency"]
    # Prefill's only with long prompts (`core.prefill.LONG_PROMPTS`): a short prompt's small
    # share of the compute peak is no shortfall.
    long = Compare(*LONG_PROMPTS)
    prompts = f"{SIGNAL_RECORDS[long.signal]} {long.op} {long.promql_threshold}"
    prefill = f"((({rec_prefill} * on ({E}) ({sm} < 1)) or {rec_prefill}) and on ({E}) ({prompts}))"
    rec_decode = SIGNAL_RECORDS["decode_efficiency"]
    decode = f"(({rec_decode} * on ({E}) ({memory} < 1)) or {rec_decode})"
    lost = f"(((1 - {memory}) > on ({E}) (1 - {sm})) or (1 - {sm}))"
    return rec(
        SIGNAL_RECORDS["card_shortfall_explained"],
        f"""
        clamp_max(
            {lost}
          / on ({E})
            (
                (1 - (({decode} <= {prefill}) or {prefill} or {decode})) > 0
              or
                0 * {sm} + 1
            ),
          1
        )
        """,
    )


# --- LLMCardThrottled's words: the core's sentence and cause actions as Go templates --------
def _promql_test(test: card_causes.Test, sel: str) -> str:
    """One comparison of a cause on one engine's record (`sel` its selector), as PromQL; an
    absent-holds one is written as `unless` the opposite (the first never is)."""
    signal, op, threshold = test[:3]
    value = threshold_promql(threshold) if threshold in THRESHOLDS else threshold
    if len(test) == 4 and test[3]:
        opposite = {">=": "<", "<": ">=", ">": "<=", "<=": ">"}[op]
        return f" unless on ({E}) {SIGNAL_RECORDS[signal]}{sel} {opposite} {value}"
    return f" and on ({E}) {SIGNAL_RECORDS[signal]}{sel} {op} {value}"


def _query(tests: tuple[card_causes.Test, ...], sel: str, args: str) -> str:
    """`printf "<query>" <args per selector> | query` for a cause's comparisons, joined."""
    text = "".join(_promql_test(t, sel) for t in tests).removeprefix(f" and on ({E}) ")
    return f'printf "{text}" {" ".join([args] * len(tests))} | query'


def _value(record: str, sel: str, args: str) -> str:
    """The engine's value of `record` as a percentage (Go template)."""
    shown = "{{ . | first | value | humanizePercentage }}"
    return f'{{{{ with printf "{record}{sel}" {args} | query }}}}{shown}{{{{ end }}}}'


def card_alert_text(sel: str, args: str) -> str:
    """The card sentence (`core.card.sentence`) and the first cause's action (the order of
    `core.card_causes.EVIDENCE`, as the verdict chooses it) for one engine, as Go templates."""
    limit_rec = SIGNAL_RECORDS["power_limit_ratio"]
    lowered = threshold_promql("power_limit_lowered_ratio")
    stock = card.limit_words(None)
    limit = (
        f'{{{{ with printf "{limit_rec}{sel} < {lowered}" {args} | query }}}}'
        + card.limit_words("{{ . | first | value | humanizePercentage }}")
        + f'{{{{ else }}}}{{{{ with printf "{limit_rec}{sel}" {args} | query }}}}{stock}'
        + "{{ end }}{{ end }}"
    )
    text = card.sentence(
        _value(SIGNAL_RECORDS["sm_clock_ratio"], sel, args),
        limit,
        explained=_value(SIGNAL_RECORDS["card_shortfall_explained"], sel, args),
        cause=True,
    )
    causes = "".join(
        f"{{{{ with {_query(tests, sel, args)} }}}}{action}{{{{ else }}}}"
        for _, tests, _, action in card_causes.EVIDENCE
    )
    return f"{text} {causes}{card_causes.VERDICT_TEXT[1]}" + "{{ end }}" * len(card_causes.EVIDENCE)
