"""The card's own state (issue 27): the words of `card_throttled` and its evidence.

The condition itself is in core/conditions.py with the others; what it says and what to do
per cause (power, temperature, clocks) is here.
"""

from __future__ import annotations

from core.thresholds import threshold_promql

# `reason` labels of llmb_gpu_clock_event_reason_active that slow a busy card because of its
# power limit or supply, and because of its heat. NVML's HW slowdown is engaged by either
# (temperature, power brake, over-current); it counts as power here, its action names both.
POWER_REASONS = ("sw_power_cap", "hw_slowdown", "hw_power_brake_slowdown")
THERMAL_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown")
IDLE_REASON = "gpu_idle"

POWER_ACTION = (
    "The card is held at its power limit: check `nvidia-smi -q -d POWER,PERFORMANCE` and "
    "raise or restore the enforced limit (`nvidia-smi -pl`, the host's or BMC's power cap), "
    "or the power supply and temperature (a power-brake or HW slowdown); the engine is not "
    "the cause."
)
THERMAL_ACTION = (
    "The card is held back by its temperature: check `nvidia-smi -q -d TEMPERATURE,"
    "PERFORMANCE`, the airflow, fans and inlet temperature of the node and its cooling; "
    "the engine is not the cause."
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
    f"below maximum) while decode runs below {_AT_LIMIT} of its roofline: the card, not the "
    "engine, sets the speed.",
    "Restore the card's clocks: its power limit, temperature and airflow; the engine is not "
    "the cause.",
)

_SLOW = ", with decode below `decode_efficiency_at_limit` (or no roofline)"
# card_throttled's evidence: label, (signal, op, threshold), text, action.
EVIDENCE: tuple[tuple[str, tuple[str, str, str], str, str], ...] = (
    (
        "power",
        ("card_power_slowdown", ">=", "card_slowdown_share_min"),
        "a power reason (SW power cap, HW slowdown, HW power brake) held the clocks down for "
        "`card_slowdown_share_min` or more of the busy samples of `rate_window`" + _SLOW,
        POWER_ACTION,
    ),
    (
        "thermal",
        ("card_thermal_slowdown", ">=", "card_slowdown_share_min"),
        "a thermal reason (SW/HW thermal slowdown) held the clocks down for "
        "`card_slowdown_share_min` or more of the busy samples of `rate_window`" + _SLOW,
        THERMAL_ACTION,
    ),
    (
        "clocks",
        ("sm_clock_ratio", "<", "sm_clock_ratio_min"),
        "the highest SM clock while busy stayed below `sm_clock_ratio_min` of its maximum "
        "over `rate_window`" + _SLOW,
        CLOCKS_ACTION,
    ),
)
