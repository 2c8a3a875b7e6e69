"""`card_throttled` (issue 27): the verdict from the card's own state, on NVML readings.

The GPU series come from the real NVML collector replaying `tests/fixtures/nvml-card-state/`
(the H200 of issue 27 and one injected fault per reason); the engine's series are written
here. The decision is `core.rules.rule_values_at` (the recording rules' arithmetic) then
`core.conditions.evaluate`, as diagnose and the parity test use them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from config.settings import EngineConfig, GpuConfig
from core import card, card_causes
from core.conditions import Verdict, evaluate
from core.promql import EngineKey, SeriesKey, series_from_scrapes
from core.rules import RuleValues, rule_values_at
from exporter.attribution import Attribution
from exporter.collectors.nvml.backend import NvmlFileBackend
from exporter.collectors.nvml.collector import NvmlCollector
from tests.paths import FIXTURES

CARD = FIXTURES / "nvml-card-state"
# The captured llama-server listens on 8080: the collector attributes its process to "llama".
LLAMA = EngineConfig(name="llama", kind="llamacpp", url="http://127.0.0.1:8080")
KEY = EngineKey("", "llama", "llamacpp")
ENGINE = (("engine", "llama"), ("kind", "llamacpp"))
STEP = 15.0
SCRAPES = 24  # 6 minutes: the 5m rate window is full


def gpu_samples(reading: dict[str, Any], tmp_path: Path) -> dict[SeriesKey, float]:
    """One scrape of the real NVML collector over this reading."""
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps(reading))
    collector = NvmlCollector(GpuConfig(), Attribution([LLAMA]), backend=NvmlFileBackend([path]))
    scrape = collector._collect_sync()
    assert scrape.up and not scrape.errors
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in scrape.metrics
        for s in fam.samples
    }


def engine_samples(i: int, decode_tok_s: float) -> dict[SeriesKey, float]:
    """An engine decoding one sequence of a 15.2 GB dense model at `decode_tok_s`."""
    return {
        ("llmb_engine_up", ENGINE): 1.0,
        ("llmb_engine_requests_running", ENGINE): 1.0,
        ("llmb_engine_requests_waiting", ENGINE): 0.0,
        ("llmb_engine_generation_tokens_total", ENGINE): i * STEP * decode_tok_s,
        ("llmb_engine_decode_tokens_total", ENGINE): i * STEP * decode_tok_s,
        ("llmb_engine_decode_seconds_total", ENGINE): i * STEP,
        ("llmb_model_weights_bytes", ENGINE): 15.2e9,
    }


def decide(
    tmp_path: Path, name: str, decode_tok_s: float = 95.0, **change: Any
) -> tuple[Verdict, RuleValues]:
    reading = json.loads((CARD / name).read_text())
    reading["devices"][0].update(change)
    gpu = gpu_samples(reading, tmp_path)
    scrapes = [(i * STEP, {**gpu, **engine_samples(i, decode_tok_s)}) for i in range(SCRAPES)]
    values = rule_values_at(series_from_scrapes(scrapes), (SCRAPES - 1) * STEP)[KEY]
    return evaluate(values.signals), values


def test_the_h200_under_load_is_not_throttled(tmp_path: Path) -> None:
    """Issue 27's H200: 1980/3201 MHz at their maxima, ~500 W of 700 W, 55 C, no reason.
    Decoding at 0.30 of the roofline, as measured there: the engine, not the card."""
    verdict, values = decide(tmp_path, "h200-load.json")
    s = values.signals
    assert (s.card_power_slowdown, s.card_thermal_slowdown, s.sm_clock_ratio) == (0, 0, 1)
    assert values.bandwidth_bytes_per_second == 4.8e12  # memory clock at its maximum
    assert verdict.name == "decode_below_card_limit"
    assert not verdict.held("card_throttled")


def test_an_idle_h200_gives_no_clock_ratio(tmp_path: Path) -> None:
    """Idle (reason 0x1) the SM clock drops to 345 MHz by design (h200-idle.json): with the
    engine's process still on the card, no clock claim and no slowdown."""
    idle = json.loads((CARD / "h200-idle.json").read_text())["devices"][0]
    change = {k: idle[k] for k in ("sm_clock_mhz", "clocks_event_reasons", "power_mw", "temp")}
    verdict, values = decide(tmp_path, "h200-load.json", **change)
    # No busy sample in the window: neither a clock nor a slowdown claim.
    assert values.signals.sm_clock_ratio is None
    assert values.signals.card_power_slowdown is None
    assert not verdict.held("card_throttled")


@pytest.mark.parametrize(
    ("reason", "evidence", "action"),
    [
        ("sw_power_cap", "power", card_causes.STOCK_LIMIT_ACTION),
        ("hw_slowdown", "power_brake", card_causes.BRAKE_ACTION),
        ("hw_power_brake_slowdown", "power_brake", card_causes.BRAKE_ACTION),
        ("sw_thermal_slowdown", "thermal", card_causes.THERMAL_ACTION),
        ("hw_thermal_slowdown", "thermal", card_causes.THERMAL_ACTION),
    ],
)
def test_a_power_or_thermal_reason_while_decode_is_slow(
    tmp_path: Path, reason: str, evidence: str, action: str
) -> None:
    """Each injected reason holds the SM clock to 35-76 % of its maximum: that loss explains
    a third or more of decode's gap (0.30 of the roofline), so the card is the cause."""
    verdict, values = decide(tmp_path, f"reason-{reason}.json")
    assert verdict.name == "card_throttled"
    assert verdict.evidence[0] == evidence
    assert verdict.action == action
    assert card.explains(values.signals.card_shortfall_explained)


@pytest.mark.parametrize(
    ("name", "evidence", "action", "power", "brake"),
    [
        # An overheating card: HW slowdown with its thermal cause. The thermal cause, not the
        # power supply; and HW slowdown counts as no power reason where HW thermal explains
        # it (issue 32 review: the brake's action and a power share of 1.0 before).
        (
            "nested-0x48-hw_thermal_slowdown.json",
            ("thermal", "clocks"),
            card_causes.THERMAL_ACTION,
            0,
            0,
        ),
        # HW slowdown with the power brake: the brake, and a power reason.
        (
            "nested-0x88-hw_power_brake_slowdown.json",
            ("power_brake", "power", "clocks"),
            card_causes.BRAKE_ACTION,
            1,
            1,
        ),
    ],
)
def test_hw_slowdown_nested_with_its_cause_as_nvml_reports_it(
    tmp_path: Path,
    name: str,
    evidence: tuple[str, ...],
    action: str,
    power: float,
    brake: float,
) -> None:
    verdict, values = decide(tmp_path, name)
    s = values.signals
    assert (s.card_power_slowdown, s.card_brake_slowdown) == (power, brake)
    assert verdict.name == "card_throttled"
    assert verdict.evidence == evidence
    assert verdict.action == action
    sentence = card.card_sentence(s, 700.0)
    assert sentence is not None
    assert ("a power reason" in sentence) == bool(power)
    assert ("HW slowdown or the power brake" in sentence) == bool(brake)


def test_hw_slowdown_counts_only_where_hw_thermal_does_not_explain_it(tmp_path: Path) -> None:
    """HW slowdown in every busy sample, HW thermal slowdown in a third of them: the other
    two thirds count as power (brake) samples, per GPU, as the rules count them."""
    hot = json.loads((CARD / "nested-0x48-hw_thermal_slowdown.json").read_text())
    hw = json.loads(json.dumps(hot))
    hw["devices"][0]["clocks_event_reasons"] = 0x8
    gpu = [gpu_samples(hw, tmp_path), gpu_samples(hot, tmp_path)]
    scrapes = [(i * STEP, {**gpu[i % 3 == 2], **engine_samples(i, 95.0)}) for i in range(SCRAPES)]
    values = rule_values_at(series_from_scrapes(scrapes), (SCRAPES - 1) * STEP)[KEY]
    s = values.signals
    assert s.card_thermal_slowdown == pytest.approx(7 / 21)  # scrapes 2, 5, ..., 20 of 21
    assert s.card_brake_slowdown == pytest.approx(14 / 21)
    assert s.card_power_slowdown == pytest.approx(14 / 21)


@pytest.mark.parametrize(
    "reason", ["applications_clocks_setting", "sync_boost", "display_clock_setting", "gpu_idle"]
)
def test_other_reasons_are_no_slowdown(tmp_path: Path, reason: str) -> None:
    verdict, _ = decide(tmp_path, f"reason-{reason}.json")
    assert verdict.name != "card_throttled"


def test_clocks_well_below_maximum_without_a_reason(tmp_path: Path) -> None:
    verdict, values = decide(tmp_path, "h200-load.json", sm_clock_mhz=1200)
    assert values.signals.sm_clock_ratio == pytest.approx(1200 / 1980)
    assert verdict.name == "card_throttled"
    assert verdict.evidence == ("clocks",)
    assert verdict.action == card_causes.CLOCKS_ACTION


def test_a_capped_card_decoding_at_its_limit_is_at_the_limit(tmp_path: Path) -> None:
    """Decode is memory-bound: at 0.6 of the roofline a power cap is not what limits it."""
    verdict, values = decide(tmp_path, "reason-sw_power_cap.json", decode_tok_s=190.0)
    assert values.signals.card_power_slowdown == 1
    assert verdict.name == "decode_at_card_limit"


def test_the_roofline_scales_with_the_memory_clock(tmp_path: Path) -> None:
    """Memory clock at 1600 of 3201 MHz: half the datasheet bandwidth in the roofline."""
    _, full = decide(tmp_path, "h200-load.json")
    _, slow = decide(tmp_path, "h200-load.json", mem_clock_mhz=1600)
    assert slow.bandwidth_bytes_per_second == pytest.approx(4.8e12 * 1600 / 3201)
    assert full.roofline_tokens_per_second is not None
    assert slow.roofline_tokens_per_second == pytest.approx(
        full.roofline_tokens_per_second * 1600 / 3201
    )


def test_an_idle_window_keeps_the_datasheet_bandwidth(tmp_path: Path) -> None:
    """GDDR cards drop their memory clock at idle (reason 0x1): no scaling then."""
    _, idle = decide(
        tmp_path, "h200-load.json", mem_clock_mhz=405, clocks_event_reasons=1, sm_clock_mhz=345
    )
    assert idle.bandwidth_bytes_per_second == 4.8e12


def test_idle_gaps_between_requests_do_not_dilute_the_slowdown(tmp_path: Path) -> None:
    """Power-capped while busy, idle (0x1, 345 MHz) every third scrape: the share counts the
    busy samples only, so the cause stays the power cap (diagnose's short steps have gaps)."""
    capped = json.loads((CARD / "reason-sw_power_cap.json").read_text())
    idle = json.loads(json.dumps(capped))
    idle["devices"][0].update(clocks_event_reasons=1, sm_clock_mhz=345)
    gpu = [gpu_samples(capped, tmp_path), gpu_samples(idle, tmp_path)]
    scrapes = [(i * STEP, {**gpu[i % 3 == 2], **engine_samples(i, 95.0)}) for i in range(SCRAPES)]
    values = rule_values_at(series_from_scrapes(scrapes), (SCRAPES - 1) * STEP)[KEY]
    assert values.signals.card_power_slowdown == 1.0
    verdict = evaluate(values.signals)
    assert verdict.name == "card_throttled"
    assert verdict.evidence[0] == "power" and verdict.action == card_causes.STOCK_LIMIT_ACTION
