"""The card's own state from NVML (issue 27): clocks, power, temperature, clock event reasons.

Replays `tests/fixtures/nvml-card-state/` (the real H200 captures with the values issue 27
recorded, and one injected fault per clock event reason) through the file-backed NVML backend and
the real collector.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from config.settings import EngineConfig, GpuConfig
from exporter.attribution import Attribution
from exporter.collectors import Scrape
from exporter.collectors.nvml.backend import NvmlFileBackend
from exporter.collectors.nvml.card import CLOCK_EVENT_REASONS
from exporter.collectors.nvml.collector import NvmlCollector
from tests.paths import FIXTURES

CARD = FIXTURES / "nvml-card-state"
LLAMA = EngineConfig(name="llama", kind="llamacpp", url="http://127.0.0.1:8080")
REASON = "llmb_gpu_clock_event_reason_active"


def collect(path: Path) -> Scrape:
    c = NvmlCollector(GpuConfig(fake_file=[path]), Attribution([LLAMA]))
    return c._collect_sync()  # the scrape itself, without the sampler thread


def samples(scrape: Scrape) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value for f in scrape.metrics for s in f.samples
    }


def value(scrape: Scrape, name: str, **labels: str) -> float:
    return samples(scrape)[(name, frozenset({"gpu": "0", **labels}.items()))]


def reasons(scrape: Scrape) -> dict[str, float]:
    return {
        dict(labels)["reason"]: v for (name, labels), v in samples(scrape).items() if name == REASON
    }


def test_h200_under_load_in_base_units_and_no_reason() -> None:
    scrape = collect(CARD / "h200-load.json")
    assert scrape.up and not scrape.errors
    assert value(scrape, "llmb_gpu_sm_clock_hertz") == 1980e6
    assert value(scrape, "llmb_gpu_sm_clock_max_hertz") == 1980e6
    assert value(scrape, "llmb_gpu_memory_clock_hertz") == 3201e6
    assert value(scrape, "llmb_gpu_memory_clock_max_hertz") == 3201e6
    assert value(scrape, "llmb_gpu_power_watts") == 500.0
    assert value(scrape, "llmb_gpu_power_limit_watts") == 700.0
    assert value(scrape, "llmb_gpu_power_limit_default_watts") == 700.0
    assert value(scrape, "llmb_gpu_power_limit_max_watts") == 700.0
    # Busy (92 %, no gpu_idle): the SM clock under load is exported too.
    assert value(scrape, "llmb_gpu_sm_clock_busy_hertz") == 1980e6
    assert value(scrape, "llmb_gpu_temperature_celsius") == 55
    # One series per reason NVML names, every one 0.
    assert reasons(scrape) == dict.fromkeys(CLOCK_EVENT_REASONS, 0)


def test_h200_idle_reports_gpu_idle_from_its_hex_text() -> None:
    scrape = collect(CARD / "h200-idle.json")
    assert value(scrape, "llmb_gpu_sm_clock_hertz") == 345e6
    assert value(scrape, "llmb_gpu_power_watts") == pytest.approx(81.952)
    assert value(scrape, "llmb_gpu_temperature_celsius") == 40
    assert {r for r, v in reasons(scrape).items() if v} == {"gpu_idle"}


@pytest.mark.parametrize("reason", list(CLOCK_EVENT_REASONS))
def test_each_injected_reason_is_its_own_series(reason: str) -> None:
    path = CARD / f"reason-{reason}.json"
    bit = json.loads(path.read_text())["devices"][0]["clocks_event_reasons"]
    assert bit == CLOCK_EVENT_REASONS[reason]
    scrape = collect(path)
    assert scrape.up and not scrape.errors
    assert reasons(scrape) == {r: float(r == reason) for r in CLOCK_EVENT_REASONS}


def test_a_lowered_limit_reads_below_its_default() -> None:
    scrape = collect(CARD / "power-limit-lowered.json")
    assert value(scrape, "llmb_gpu_power_limit_watts") == 420.0
    assert value(scrape, "llmb_gpu_power_limit_default_watts") == 700.0
    assert value(scrape, "llmb_gpu_power_limit_max_watts") == 700.0


@pytest.mark.parametrize(
    ("util", "reasons", "busy"),
    [(92, 0, True), (50, 4, True), (49, 4, False), (92, 1, False)],
)
def test_the_busy_sm_clock_only_in_busy_samples(
    tmp_path: Path, util: int, reasons: int, busy: bool
) -> None:
    """At or above `card_busy_utilization_min` and not `gpu_idle`: the samples between
    requests keep the boost clock with no work to slow and must not count."""
    reading = json.loads((CARD / "h200-load.json").read_text())
    reading["devices"][0].update(util={"gpu": util, "memory": 0}, clocks_event_reasons=reasons)
    path = tmp_path / "n.json"
    path.write_text(json.dumps(reading))
    got = {name for name, _ in samples(collect(path))}
    assert ("llmb_gpu_sm_clock_busy_hertz" in got) == busy
    assert "llmb_gpu_sm_clock_hertz" in got


def test_several_reasons_at_once(tmp_path: Path) -> None:
    reading = json.loads((CARD / "h200-load.json").read_text())
    reading["devices"][0]["clocks_event_reasons"] = 0x4 | 0x20 | 0x80
    path = tmp_path / "n.json"
    path.write_text(json.dumps(reading))
    active = {r for r, v in reasons(collect(path)).items() if v}
    assert active == {"sw_power_cap", "sw_thermal_slowdown", "hw_power_brake_slowdown"}


@pytest.mark.parametrize(
    ("key", "bad", "family"),
    [
        ("temp", "hot", "llmb_gpu_temperature_celsius"),
        ("power_mw", [1], "llmb_gpu_power_watts"),
        ("power_limit_mw", {"w": 700}, "llmb_gpu_power_limit_watts"),
        ("sm_clock_mhz", "fast", "llmb_gpu_sm_clock_hertz"),
        ("clocks_event_reasons", "0xzz", REASON),
    ],
)
def test_a_bad_field_drops_only_itself_with_a_parse_error(
    tmp_path: Path, key: str, bad: Any, family: str
) -> None:
    reading = json.loads((CARD / "h200-load.json").read_text())
    reading["devices"][0][key] = bad
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(reading))
    scrape = collect(path)
    assert scrape.up
    assert [e.reason for e in scrape.errors] == ["parse"]
    got = {name for name, _ in samples(scrape)}
    assert family not in got
    # Everything else is still there.
    others = {
        "llmb_gpu_temperature_celsius",
        "llmb_gpu_power_watts",
        "llmb_gpu_power_limit_watts",
        "llmb_gpu_sm_clock_hertz",
        "llmb_gpu_memory_used_bytes",
        REASON,
    } - {family}
    assert others <= got


def test_a_card_without_these_queries_leaves_them_out(tmp_path: Path) -> None:
    """The captures before issue 27 have no limit, no SM maximum and no reasons: not
    supported, no error, and the rest of the reading as before."""
    source = FIXTURES / "llamacpp-h200-gemma3-27b-shape-q4_0" / "nvml_3_generating.json"
    scrape = collect(source)
    assert scrape.up and not scrape.errors
    got = {name for name, _ in samples(scrape)}
    assert {"llmb_gpu_power_limit_watts", "llmb_gpu_sm_clock_max_hertz", REASON}.isdisjoint(got)
    assert value(scrape, "llmb_gpu_power_watts") == pytest.approx(385.6)
    assert value(scrape, "llmb_gpu_temperature_celsius") == 53


def test_fake_backend_reads_the_card_fields() -> None:
    fake = NvmlFileBackend(CARD / "reason-sw_power_cap.json")
    fake.init()
    assert fake.device_count() == 1
    assert fake.sm_clock_mhz(0) == (1410, 1980)
    assert fake.power_mw(0) == 699800
    assert fake.power_limit_mw(0) == 700000
    assert fake.power_default_limit_mw(0) == fake.power_max_limit_mw(0) == 700000
    assert fake.temperature_c(0) == 55
    assert fake.clock_event_reasons(0) == 0x4
