"""The card's own state (issues 27, 32): the reasons NVML reports and how they count, the
share of the gap to the roofline the lost clock explains, and the sentence that says what
the card did beside any verdict.

The condition itself is in core/conditions.py with the others; its causes, what each says
and what to do, are in core/card_causes.py. The card is the cause only when its lost clock
explains a real part of the gap to the roofline (`card_shortfall_explained_min`) and a
cause holds; otherwise what NVML reported is evidence shown beside the verdict
(`card_sentence`), not the verdict.
"""

from __future__ import annotations

from core.card_causes import EXPLAINS
from core.conditions import evaluate
from core.predicates import Compare
from core.prefill import LONG_PROMPTS
from core.signals import Signals
from core.thresholds import threshold_number

# `reason` labels of llmb_gpu_clock_event_reason_active that slow a busy card because of its
# power limit or supply, and because of its heat.
POWER_REASONS = ("sw_power_cap", "hw_slowdown", "hw_power_brake_slowdown")
BRAKE_REASONS = ("hw_slowdown", "hw_power_brake_slowdown")
THERMAL_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown")
# NVML's HW slowdown (0x8) is the parent of HW thermal slowdown (0x40) and the HW power brake
# (0x80): an overheating card reads 0x48 (`nvidia-smi -q` nests them). HW slowdown counts as
# power (and brake) only in the busy samples HW thermal slowdown does not explain: its count
# less HW thermal slowdown's (exact as NVML sets 0x8 with every 0x40), never below 0.
HW_SLOWDOWN = "hw_slowdown"
HW_SLOWDOWN_EXPLAINED_BY = "hw_thermal_slowdown"
IDLE_REASON = "gpu_idle"


def clock_scale(sm_clock_ratio: float | None) -> float:
    """What a compute roofline scales by: the SM clock under load / its maximum where it is
    below 1 (a card that boosts past its maximum gains nothing here), else 1."""
    return sm_clock_ratio if sm_clock_ratio is not None and sm_clock_ratio < 1 else 1.0


def clock_scaled_peak(peak_flops: float, sm_clock_ratio: float | None) -> float:
    """A GPU's dense peak FLOP/s at the SM clock it ran under load (prefill's roofline):
    `peak * on (host, gpu) ((sm ratio < 1) or 1)` in the rules."""
    return peak_flops * clock_scale(sm_clock_ratio)


def shortfall_explained(
    sm_clock_ratio: float | None,
    decode_efficiency: float | None,
    prefill_efficiency: float | None,
    memory_clock_ratio: float | None = None,
    prompt_tokens_mean: float | None = None,
) -> float | None:
    """The share of the gap to the roofline the lost clock explains, at most 1: (1 - the
    lower of the SM and memory clock ratios) / (1 - the lowest efficiency known, each taken
    back to the maximum clocks: prefill's x the SM ratio, decode's x the memory ratio, as
    their roofline scale with them), the gap 1 without a roofline (or at or beyond it).
    Prefill's counts only with long prompts (`prompt_tokens_mean` >=
    `prefill_prompt_tokens_min`, as the prefill verdicts need): a short prompt reads a small
    share of the compute peak by nature, and that gap is no shortfall. Absent without an SM
    clock under load. As the rule `engine:llmb_card_shortfall_explained:ratio<rw>`."""
    if sm_clock_ratio is None:
        return None
    if not Compare(*LONG_PROMPTS).test(Signals(prompt_tokens_mean=prompt_tokens_mean)):
        prefill_efficiency = None
    if prefill_efficiency is not None:
        prefill_efficiency = prefill_efficiency * clock_scale(sm_clock_ratio)
    if decode_efficiency is not None:
        decode_efficiency = decode_efficiency * clock_scale(memory_clock_ratio)
    known = [e for e in (decode_efficiency, prefill_efficiency) if e is not None]
    gap = 1 - min(known) if known else 1.0
    if not gap > 0:
        gap = 1.0
    lost = 1 - sm_clock_ratio
    if memory_clock_ratio is not None and 1 - memory_clock_ratio > lost:
        lost = 1 - memory_clock_ratio
    return min(lost / gap, 1.0)


def explains(explained: float | None) -> bool:
    """Whether the lost clock explains enough of the gap (one of card_throttled's tests; the
    card is the cause only where the whole condition holds)."""
    return Compare(*EXPLAINS).test(Signals(card_shortfall_explained=explained)) is True


def _pct(ratio: float) -> str:
    return f"{ratio * 100:.0f} %"


# Said beside a prefill efficiency whose peak the clock under load scaled (`clock_scaled_peak`).
SCALED_NOTE = "Prefill's compute roofline is taken at this clock, not the maximum."


def limit_words(lowered_to: str | None, watts: str = "") -> str:
    """The power limit in the card sentence: lowered to `lowered_to` of the default, or the
    stock one (`watts`: " 700 W", or empty)."""
    if lowered_to is not None:
        return f", its enforced{watts} power limit lowered to {lowered_to} of the default"
    return f" at its stock{watts} power limit"


def sentence(
    clock: str,
    limit: str = "",
    reasons: str = "",
    explained: str | None = None,
    cause: bool = False,
) -> str:
    """The card sentence from its parts, already written: numbers in Python (`card_sentence`),
    Go templates in the alert (mixin/rules/alerts.py), so both say it alike."""
    text = f"The card ran at {clock} of its maximum SM clock under load{limit}"
    if reasons:
        text += f" ({reasons} of the busy samples)"
    if explained is None:
        return text + "."
    verdict = "the card is the cause" if cause else "not the cause"
    return f"{text}: the lost clock explains {explained} of the gap to the roofline, {verdict}."


def card_sentence(signals: Signals, limit_watts: float | None = None) -> str | None:
    """What the card did under load, in one sentence shown beside any verdict (the CLI
    answer and the report; the alert writes the same parts as templates); None without a
    busy sample. `limit_watts`: the enforced power limit, where the caller has it."""
    s = signals
    if s.sm_clock_ratio is None:
        return None
    watts = f" {limit_watts:.0f} W" if limit_watts is not None else ""
    limit = ""
    if s.power_limit_ratio is not None:
        lowered = s.power_limit_ratio < threshold_number("power_limit_lowered_ratio")
        limit = limit_words(_pct(s.power_limit_ratio) if lowered else None, watts)
    reasons = ", ".join(
        f"{what} in {_pct(share)}"
        for what, share in (
            ("a power reason", s.card_power_slowdown),
            ("HW slowdown or the power brake", s.card_brake_slowdown),
            ("a thermal slowdown", s.card_thermal_slowdown),
        )
        if share is not None and share > 0
    )
    explained = s.card_shortfall_explained
    text = sentence(
        _pct(s.sm_clock_ratio),
        limit,
        reasons,
        None if explained is None else _pct(max(explained, 0.0)),
        # The cause only where the verdict's condition holds (a reason or a clock well below
        # maximum too), not from the explained share alone.
        evaluate(s).held("card_throttled"),
    )
    if s.prefill_efficiency is not None and clock_scale(s.sm_clock_ratio) < 1:
        text += " " + SCALED_NOTE
    return text
