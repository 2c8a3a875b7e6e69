"""The card's own state (issue 27): clocks against their maxima, power, temperature and the
clock event reasons NVML reports, beside the verdict `card_throttled` decides from them."""

from __future__ import annotations

from core import series as llmb
from core.card import POWER_REASONS, THERMAL_REASONS
from core.card_causes import cause_actions
from mixin.config import MixinConfig
from mixin.dashboards.panels import HSEL, RW, SEL, Limit, Panel, Row, Target, ts

_GPU = "{{host}} GPU {{gpu}}"


def card_row(cfg: MixinConfig) -> Row:
    """Per card: clocks / maxima, power / limit, temperature, slowdown reasons."""
    return Row("Card state: clocks, power, temperature", [*_state_panels(), *_slowdown_panels(cfg)])


def _state_panels() -> list[Panel]:
    """Clocks against their maxima, power against the limit, temperature."""
    return [
        ts(
            "Clocks / their maxima",
            Target(
                f"max by (host, gpu) ({llmb.GPU_SM_CLOCK_HERTZ}{{{HSEL}}}) / "
                f"max by (host, gpu) ({llmb.GPU_SM_CLOCK_MAX_HERTZ}{{{HSEL}}})",
                f"{_GPU} SM",
            ),
            Target(
                f"max by (host, gpu) ({llmb.GPU_MEMORY_CLOCK_HERTZ}{{{HSEL}}}) / "
                f"max by (host, gpu) ({llmb.GPU_MEMORY_CLOCK_MAX_HERTZ}{{{HSEL}}})",
                f"{_GPU} memory",
            ),
            Target(
                f"gpu:llmb_gpu_sm_clock:ratio{RW}{{{HSEL}}}", f"{_GPU} SM under load, mean {RW}"
            ),
            unit="percentunit",
            width=8,
            limit=Limit("sm_clock_ratio_min", "above"),
            description=(
                "SM and memory clocks against their maxima (NVML). Idle cards drop their "
                "SM clock by design, and between requests a card sits at its boost clock "
                "with no work: the clock under load is the mean of the busy samples "
                f"(`{llmb.GPU_SM_CLOCK_BUSY_HERTZ}`); below the line (`sm_clock_ratio_min`) "
                "it is held down. The roofline scales its bandwidth by the memory clock's "
                "ratio. H200 under decode: 1980/1980 and 3201/3201 MHz; under F16 prefill at "
                "its stock 700 W: 96 % of 1980 MHz."
            ),
        ),
        ts(
            "Power draw and limit",
            Target(f"max by (host, gpu) ({llmb.GPU_POWER_WATTS}{{{HSEL}}})", f"{_GPU} draw"),
            *(
                Target(f"max by (host, gpu) ({series}{{{HSEL}}})", f"{_GPU} {limit} limit")
                for series, limit in (
                    (llmb.GPU_POWER_LIMIT_WATTS, "enforced"),
                    (llmb.GPU_POWER_LIMIT_DEFAULT_WATTS, "default"),
                    (llmb.GPU_POWER_LIMIT_MAX_WATTS, "max"),
                )
            ),
            unit="watt",
            width=8,
            description=(
                "Power draw against the limit the driver enforces, the card's default "
                "(stock) limit and the highest it accepts. Draw pinned at the limit under "
                "load, with `sw_power_cap` active, holds the clocks down: with the enforced "
                "limit below the default someone lowered it, at the default the card is its "
                "own limit. H200 under decode: about 500 W of 700 W (all three 700 W)."
            ),
        ),
        ts(
            "Temperature",
            Target(f"max by (host, gpu) ({llmb.GPU_TEMPERATURE_CELSIUS}{{{HSEL}}})", _GPU),
            unit="celsius",
            width=8,
            description=(
                "GPU core temperature. A thermal slowdown reason beside a rising line "
                "points at airflow or cooling. H200 under load: about 55 C."
            ),
        ),
    ]


def _slowdown_panels(cfg: MixinConfig) -> list[Panel]:
    """The power and thermal reasons per card, and their share per engine."""
    slowdown = "|".join(POWER_REASONS + THERMAL_REASONS)
    return [
        ts(
            "Slowdown reasons active",
            Target(
                f"max by (host, gpu, reason) ({llmb.GPU_CLOCK_EVENT_REASON_ACTIVE}"
                f'{{{HSEL}, reason=~"{slowdown}"}})',
                f"{_GPU} {{{{reason}}}}",
            ),
            unit="none",
            width=12,
            description=(
                "The power and thermal clock event reasons NVML reports (1 while "
                "active). `gpu_idle`, `sync_boost` and the clock settings are left "
                "out: they do not slow a busy card by themselves."
            ),
        ),
        ts(
            "Card slowed, per engine",
            Target(f"engine:llmb_gpu_power_slowdown:avg{RW}{{{SEL}}}", "{{engine}} power"),
            Target(f"engine:llmb_gpu_thermal_slowdown:avg{RW}{{{SEL}}}", "{{engine}} thermal"),
            Target(
                f"engine:llmb_card_shortfall_explained:ratio{RW}{{{SEL}}}",
                "{{engine}} share of the gap the lost clock explains",
            ),
            unit="percentunit",
            width=12,
            limit=Limit("card_slowdown_share_min", "below"),
            description=(
                f"Share of the busy samples of the last {RW} in which a power or thermal "
                "reason held the clocks of the engine's GPUs down, and the share of the gap "
                "to the roofline the lost SM or memory clock explains. With a reason above "
                "the line (`card_slowdown_share_min`), the explained share at or above "
                "`card_shortfall_explained_min` and decode below the card's limit the verdict "
                "is `card_throttled` and LLMCardThrottled fires; below it what the card did "
                "is evidence, not the cause. The action by cause, first that holds: "
                + " ".join(f"{label}: {action}" for label, action in cause_actions())
                + f" {cfg.runbook_url}#llmcardthrottled"
            ),
        ),
    ]
