"""Host memory bandwidth (issue 32 item 4): measured once, exported with its source, given by
flag or config instead, and the bound of the rules taken from it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from config.settings import Config, ConfigError, GpuConfig, load_config
from core.promql import EngineKey
from core.rules import rule_values_at
from diagnose.decision.model import Facts
from diagnose.facts import host_bandwidth_facts
from diagnose.options import add_host_bandwidth_option, run_host_bandwidth
from exporter.__main__ import parse_args
from exporter.app import build_runner
from exporter.runner import Runner
from model.host_memory import (
    HostBandwidth,
    host_bandwidth,
    last_level_cache_bytes,
    measure_host_bandwidth,
)


def test_the_copy_counts_read_and_write_over_its_fastest_pass() -> None:
    # A small buffer (the real one is 2 x the last-level cache): the arithmetic, not the host.
    bw = measure_host_bandwidth(buffer_bytes=4 * 2**20, threads=2, budget_seconds=0.0)
    # Anything a real memory system moves: above 100 MB/s, below 10 TB/s.
    assert 1e8 < bw < 1e13


def test_the_last_level_cache_is_the_largest_sysfs_names(tmp_path: Path) -> None:
    for name, size in (("index0", "48K"), ("index2", "2048K"), ("index3", "105M")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "size").write_text(size + "\n")
    (tmp_path / "index9").mkdir()  # no size file: skipped
    assert last_level_cache_bytes(tmp_path) == 105 * 2**20
    assert last_level_cache_bytes(tmp_path / "absent") is None


def test_flag_beats_config_beats_measurement() -> None:
    def never() -> float:
        raise AssertionError("measured although a figure was given")

    assert host_bandwidth(41.5e9, 60e9, never) == HostBandwidth(41.5e9, "flag")
    assert host_bandwidth(None, 60e9, never) == HostBandwidth(60e9, "config")
    assert host_bandwidth(None, None, lambda: 38.9e9) == HostBandwidth(38.9e9, "measured")
    assert HostBandwidth(41.5e9, "flag").describe() == "41.5 GB/s, flag"


def test_the_config_key_is_typed_and_positive(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("host_memory_bandwidth_bytes_per_second: 4.15e10\n")
    assert load_config(str(good), {}).host_memory_bandwidth_bytes_per_second == 4.15e10
    for text in ("host_memory_bandwidth_bytes_per_second: 0\n", "host_memory_bandwith: 1e10\n"):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ConfigError):
            load_config(str(bad), {})


async def _host_series(runner: Runner) -> dict[str, float]:
    families = await runner.scrape()
    return {
        s.labels["source"]: s.value
        for f in families
        for s in f.samples
        if s.name == "llmb_host_memory_bandwidth_bytes_per_second"
    }


async def test_the_exporter_exports_the_figure_with_its_source() -> None:
    gpu_off = GpuConfig(enabled=False)
    measured = build_runner(Config(gpu=gpu_off), host_bandwidth=HostBandwidth(38.9e9, "measured"))
    assert await _host_series(measured) == {"measured": 38.9e9}
    configured = build_runner(Config(gpu=gpu_off, host_memory_bandwidth_bytes_per_second=6e10))
    assert await _host_series(configured) == {"config": 6e10}
    # Nothing given and nothing measured (the caller measures, not build_runner): no series.
    bare = build_runner(Config(gpu=gpu_off))
    assert await _host_series(bare) == {}
    for r in (measured, configured, bare):
        await r.close()


def test_the_exporter_flag_in_gb_per_second() -> None:
    assert parse_args(["--host-bandwidth-gbs", "41.5"]).host_bandwidth_gbs == 41.5
    for bad in ("0", "-3", "fast", "inf"):
        with pytest.raises(SystemExit) as exc:
            parse_args(["--host-bandwidth-gbs", bad])
        assert exc.value.code == 2


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_host_bandwidth_option(parser)
    parser.add_argument("--exporter-url")
    return parser.parse_args(list(argv))


def test_diagnose_measures_once_unless_given_or_the_exporter_measures() -> None:
    calls: list[int] = []

    def measure() -> float:
        calls.append(1)
        return 40e9

    flagged = run_host_bandwidth(_args("--host-bandwidth-gbs", "41.5"), None, measure)
    assert flagged == HostBandwidth(41.5e9, "flag") and not calls
    cfg = Config(host_memory_bandwidth_bytes_per_second=5e10)
    assert run_host_bandwidth(_args(), cfg, measure) == HostBandwidth(5e10, "config")
    # An external exporter measured its own host: its series is read, nothing measured here.
    assert run_host_bandwidth(_args("--exporter-url", "http://x:9490"), None, measure) is None
    assert not calls
    assert run_host_bandwidth(_args(), None, measure) == HostBandwidth(40e9, "measured")
    assert calls == [1]


def _moe_series(bandwidth: float | None) -> dict[tuple[str, tuple[tuple[str, str], ...]], list]:
    engine = (("engine", "moe"), ("host", "h"), ("kind", "llamacpp"))
    series = {
        ("llmb_engine_up", engine): [(0.0, 1.0)],
        ("llmb_engine_experts_host_layers", engine): [(0.0, 24.0)],
        ("llmb_engine_experts_host_bytes", engine): [(0.0, 15401484288.0)],
        ("llmb_model_experts", engine): [(0.0, 128.0)],
        ("llmb_model_experts_used", engine): [(0.0, 8.0)],
    }
    if bandwidth is not None:
        key = (("host", "h"), ("source", "flag"))
        series[("llmb_host_memory_bandwidth_bytes_per_second", key)] = [(0.0, bandwidth)]
    return series


def test_the_rules_bound_uses_the_host_series_and_no_constant() -> None:
    key = EngineKey("h", "moe", "llamacpp")
    # Issue 32's H200 run: 14.34 GiB of host experts, 8 of 128 read per step at batch 1,
    # the host delivered 41.5 GiB/s: about 46.3 tok/s, where 100 GB/s said 103.9.
    values = rule_values_at(_moe_series(41.5 * 2**30), 10.0)[key]
    assert values.experts_host_bound_tokens_per_second == pytest.approx(
        41.5 * 2**30 / (15401484288.0 * 8 / 128), rel=1e-9
    )
    assert rule_values_at(_moe_series(None), 10.0)[key].experts_host_bound_tokens_per_second is None


def test_diagnose_takes_the_exporter_series_unless_given_a_figure() -> None:
    series = {
        ("llmb_host_memory_bandwidth_bytes_per_second", (("host", "h"), ("source", "measured"))): (
            38.9e9
        )
    }
    res = host_bandwidth_facts(Facts("moe", "llamacpp"), None, series)
    assert (res.host_bandwidth_bytes_per_s, res.host_bandwidth_source) == (38.9e9, "measured")
    # This run's own measurement does not replace the exporter's (it measured its host).
    res = host_bandwidth_facts(res, HostBandwidth(50e9, "measured"), series)
    assert res.host_bandwidth_source == "measured" and res.host_bandwidth_bytes_per_s == 38.9e9
    # A flag (or the config) does.
    res = host_bandwidth_facts(res, HostBandwidth(41.5e9, "flag"), series)
    assert (res.host_bandwidth_bytes_per_s, res.host_bandwidth_source) == (41.5e9, "flag")
    # No exporter series (no GPU, no exporter): this run's measurement.
    bare = host_bandwidth_facts(Facts("moe", "llamacpp"), HostBandwidth(50e9, "measured"), None)
    assert (bare.host_bandwidth_bytes_per_s, bare.host_bandwidth_source) == (50e9, "measured")


def test_a_failed_measurement_gives_no_figure_and_no_crash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def no_memory() -> float:
        raise MemoryError("256 MiB")

    assert host_bandwidth(None, None, no_memory) is None
    assert "host memory bandwidth not measured: MemoryError: 256 MiB" in caplog.text
