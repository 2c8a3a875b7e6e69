"""The card's own state (issues 27, 32): the words of `card_throttled`, its evidence per cause,
and the sentence that says what the card did beside any verdict.

The condition itself is in core/conditions.py with the others; what it says and what to do
per cause (a lowered power limit, a power brake, temperature, the card's own stock limit,
clocks) is here. The card is the cause only when its lost clock explains a real part of the
gap to the roofline (`card_shortfall_explained_min`); otherwise what NVML reported is
evidence shown beside the verdict (`card_sentence`), not the verdict.
"""

from __future__ import annotations

from core.signals import Signals
from core.thresholds import threshold_number, threshold_promql

# `reason` labels of llmb_gpu_clock_event_reason_active that slow a busy card because of its
# power limit or supply, and because of its heat. NVML's HW slowdown is engaged by either
# (temperature, power brake, over-current); it counts as power here, with the power brake.
POWER_REASONS = ("sw_power_cap", "hw_slowdown", "hw_power_brake_slowdown")
BRAKE_REASONS = ("hw_slowdown", "hw_power_brake_slowdown")
THERMAL_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown")
IDLE_REASON = "gpu_idle"

LOWERED_LIMIT_ACTION = (
    "Someone lowered the card's power limit below its default: restore it "
    "(`nvidia-smi -pl <default W>`, see `nvidia-smi -q -d POWER`), or lift the host's or "
    "BMC's power cap that set it; the engine is not the cause."
)
BRAKE_ACTION = (
    "The card's hardware slowed it (HW slowdown or power brake: an external signal from "
    "the power supply, an over-current or the chassis): check the power supply, its cabling "
    "and the node's power budget (`nvidia-smi -q -d PERFORMANCE`); the engine is not the "
    "cause."
)
THERMAL_ACTION = (
    "The card is held back by its temperature: check `nvidia-smi -q -d TEMPERATURE,"
    "PERFORMANCE`, the airflow, fans and inlet temperature of the node and its cooling; "
    "the engine is not the cause."
)
STOCK_LIMIT_ACTION = (
    "The card runs at its own stock power limit and lowers its clocks to stay under it: the "
    "card is the limit, and there is no lowered limit to raise (check `nvidia-smi -q -d "
    "POWER`: enforced = default). Less work per token (a smaller quantization, shorter "
    "prompts) or a card with more compute per watt goes faster; the engine is not the cause."
)
CLOCKS_ACTION = (
    "The SM clock stays well below its maximum without a power or thermal reason: reset "
    "locked or application clocks (`nvidia-smi -rgc`, `-rac`) and check "
    "`nvidia-smi -q -d CLOCK,PERFORMANCE`; the engine is not the cause."
)
# (summary, action) of the verdict; the held evidence's action above says more.
_AT_LIMIT = threshold_promql("decode_efficiency_at_limit")
VERDICT_TEXT = (
    "The card runs below its clocks (a power or thermal slowdown NVML reports, or clocks well "
    f"below maximum) while decode runs below {_AT_LIMIT} of its roofline, and the lost clock "
    "explains a real part of the gap to the roofline: the card, not the engine, sets the "
    "speed.",
    "Restore the card's clocks: its power limit, power supply, temperature and airflow; the "
    "engine is not the cause.",
)

# Every alternative of card_throttled also needs these (core/conditions.py adds them): the
# lost clock explains `card_shortfall_explained_min` of the gap, and decode is below the
# card's limit (or has no roofline).
EXPLAINS = ("card_shortfall_explained", ">=", "card_shortfall_explained_min")
_SLOW = (
    ", the lost SM or memory clock explains `card_shortfall_explained_min` or more of the gap "
    "to the roofline, and decode runs below `decode_efficiency_at_limit` (or no roofline)"
)
_NOT_LOWERED = ("power_limit_ratio", ">=", "power_limit_lowered_ratio", True)

Test = tuple[str, str, str] | tuple[str, str, str, bool]
# card_throttled's evidence, in the order their actions are chosen: label, tests (signal,
# op, threshold[, absent holds]), text, action.
EVIDENCE: tuple[tuple[str, tuple[Test, ...], str, str], ...] = (
    (
        "power_limit_lowered",
        (
            ("card_power_slowdown", ">=", "card_slowdown_share_min"),
            ("power_limit_ratio", "<", "power_limit_lowered_ratio"),
        ),
        "the enforced power limit is below `power_limit_lowered_ratio` of the card's default, "
        "and a power reason held the clocks down for `card_slowdown_share_min` or more of the "
        "busy samples of `rate_window`" + _SLOW,
        LOWERED_LIMIT_ACTION,
    ),
    (
        "power_brake",
        (("card_brake_slowdown", ">=", "card_slowdown_share_min"),),
        "HW slowdown or the HW power brake held the clocks down for `card_slowdown_share_min` "
        "or more of the busy samples of `rate_window`" + _SLOW,
        BRAKE_ACTION,
    ),
    (
        "thermal",
        (("card_thermal_slowdown", ">=", "card_slowdown_share_min"),),
        "a thermal reason (SW/HW thermal slowdown) held the clocks down for "
        "`card_slowdown_share_min` or more of the busy samples of `rate_window`" + _SLOW,
        THERMAL_ACTION,
    ),
    (
        "power",
        (("card_power_slowdown", ">=", "card_slowdown_share_min"), _NOT_LOWERED),
        "at its default (stock) power limit, a power reason held the clocks down for "
        "`card_slowdown_share_min` or more of the busy samples of `rate_window`" + _SLOW,
        STOCK_LIMIT_ACTION,
    ),
    (
        "clocks",
        (("sm_clock_ratio", "<", "sm_clock_ratio_min"),),
        "the mean SM clock of the busy samples of `rate_window` stayed below "
        "`sm_clock_ratio_min` of its maximum" + _SLOW,
        CLOCKS_ACTION,
    ),
)


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
) -> float | None:
    """The share of the gap to the roofline the lost clock explains, at most 1: (1 - the
    lower of the SM and memory clock ratios) / (1 - the lowest efficiency known, each taken
    back to the maximum clocks: prefill's x the SM ratio, decode's x the memory ratio, as
    their roofline scale with them), the gap 1 without a roofline (or at or beyond it).
    Absent without an SM clock under load. As the rule
    `engine:llmb_card_shortfall_explained:ratio<rw>`."""
    if sm_clock_ratio is None:
        return None
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
    """Whether the lost clock explains enough of the gap for the card to be the cause."""
    return explained is not None and explained >= threshold_number("card_shortfall_explained_min")


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
        explains(explained),
    )
    if s.prefill_efficiency is not None and clock_scale(s.sm_clock_ratio) < 1:
        text += " " + SCALED_NOTE
    return text


def cause_actions() -> tuple[tuple[str, str], ...]:
    """(evidence label, action) of card_throttled's causes, in the order the verdict picks
    the first that holds (the dashboard lists them; the alert says the first)."""
    return tuple((label, action) for label, _, _, action in EVIDENCE)
