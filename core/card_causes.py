"""card_throttled's causes (issues 27, 32): per cause, its tests, what it means and what to do
(a lowered power limit, temperature, a power brake, the card's own stock limit, clocks), and
the verdict's words. The condition is built from these in core/conditions.py; the sentence
beside any verdict and the reasons' arithmetic are in core/card.py.
"""

from __future__ import annotations

from core.thresholds import threshold_promql

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
# op, threshold[, absent holds]), text, action. Thermal before the brake: an overheating
# card also sets HW slowdown.
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
        "thermal",
        (("card_thermal_slowdown", ">=", "card_slowdown_share_min"),),
        "a thermal reason (SW/HW thermal slowdown) held the clocks down for "
        "`card_slowdown_share_min` or more of the busy samples of `rate_window`" + _SLOW,
        THERMAL_ACTION,
    ),
    (
        "power_brake",
        (("card_brake_slowdown", ">=", "card_slowdown_share_min"),),
        "the HW power brake, or HW slowdown without HW thermal slowdown, held the clocks down "
        "for `card_slowdown_share_min` or more of the busy samples of `rate_window`" + _SLOW,
        BRAKE_ACTION,
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


def cause_actions() -> tuple[tuple[str, str], ...]:
    """(evidence label, action) of card_throttled's causes, in the order the verdict picks
    the first that holds (the dashboard lists them; the alert says the first)."""
    return tuple((label, action) for label, _, _, action in EVIDENCE)
