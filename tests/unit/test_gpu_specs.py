"""Bandwidth figures: config over the known-GPU table over clock x bus width."""

from __future__ import annotations

import json

import pytest

from config.settings import GpuConfig
from exporter.attribution import Attribution
from exporter.collectors.nvml.collector import NvmlCollector
from model.gpu_specs import (
    clock_bus_bandwidth,
    configured_bandwidth,
    normalize_name,
    resolve_bandwidth,
    table_bandwidth,
)
from tests.paths import FIXTURES

H200 = FIXTURES / "llamacpp-h200-gemma3-27b-shape-q4_0"
H200_UUID = "GPU-8dfe4d19-1004-3586-8bc1-dba3369af561"


@pytest.mark.parametrize(
    ("nvml_name", "expected"),
    [
        ("NVIDIA H200", 4.8e12),
        ("NVIDIA H200 NVL", 4.8e12),
        ("NVIDIA H100 80GB HBM3", 3.35e12),
        ("NVIDIA H100 PCIe", 2.0e12),
        ("NVIDIA H100 NVL", 3.9e12),
        ("NVIDIA A100-SXM4-40GB", 1.555e12),
        ("NVIDIA A100-PCIE-40GB", 1.555e12),
        ("NVIDIA A100-SXM4-80GB", 2.039e12),
        ("NVIDIA A100 80GB PCIe", 1.935e12),
        ("NVIDIA L40S", 864e9),
        ("NVIDIA L4", 300e9),
        ("NVIDIA GeForce RTX 4090", 1.008e12),
        ("NVIDIA GeForce RTX 5090", 1.792e12),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 1.792e12),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 1.792e12),
        ("NVIDIA RTX PRO 5000 Blackwell", 1.344e12),
        ("NVIDIA RTX PRO 5000 72GB Blackwell", None),  # name unknown to us: no guess
        ("NVIDIA RTX 6000 Ada Generation", 960e9),
        ("NVIDIA A10", 600e9),
        ("NVIDIA A10G", 600e9),
        ("Tesla T4", 320e9),
        ("Tesla V100-SXM2-32GB", 900e9),
        ("Tesla V100S-PCIE-32GB", None),  # 1,134 GB/s part: must not take the V100 figure
        ("NVIDIA GeForce RTX 4090 Laptop GPU", None),
        ("NVIDIA RTX A1000", None),
    ],
)
def test_table_matches_nvml_names(nvml_name: str, expected: float | None) -> None:
    assert table_bandwidth(nvml_name) == expected


def test_normalize_name() -> None:
    assert normalize_name("NVIDIA A100-SXM4-80GB") == "nvidia a100 sxm4 80gb"


def test_h200_capture_formula_vs_table() -> None:
    """clock x bus x 2 on the captured H200 (3201 MHz, 6016 bits) vs the datasheet 4.8 TB/s."""
    dev = json.loads((H200 / "nvml_2_loaded.json").read_text())["devices"][0]
    assert (dev["max_mem_clock_mhz"], dev["bus_width"]) == (3201, 6016)
    formula = clock_bus_bandwidth(dev["max_mem_clock_mhz"], dev["bus_width"])
    assert formula == 3201e6 * 6016 / 8 * 2 == 4.814304e12
    table = table_bandwidth(dev["name"])
    assert table == 4.8e12
    assert formula / table - 1 == pytest.approx(0.00298, abs=1e-5)  # HBM: +0.3 %
    # The table wins when the GPU is known.
    chosen = resolve_bandwidth(dev["name"], 0, dev["uuid"], 3201, 6016)
    assert (chosen.bytes_per_second, chosen.source) == (4.8e12, "table")
    # An unknown name falls back to the formula.
    fallback = resolve_bandwidth("NVIDIA Future HBM Part", 0, "GPU-x", 3201, 6016)
    assert (fallback.bytes_per_second, fallback.source) == (formula, "clock_bus")


def test_formula_needs_both_inputs() -> None:
    assert clock_bus_bandwidth(None, 6016) is None
    assert clock_bus_bandwidth(3201, None) is None
    assert resolve_bandwidth("NVIDIA Future GPU", 0, "GPU-x", None, None).source == "none"


def test_config_override_single_value_and_per_gpu() -> None:
    assert configured_bandwidth(None, 0, H200_UUID) is None
    assert configured_bandwidth(3.0e12, 0, H200_UUID) == 3.0e12
    assert configured_bandwidth({"0": 1.0e12}, 0, H200_UUID) == 1.0e12
    assert configured_bandwidth({"1": 1.0e12}, 0, H200_UUID) is None
    assert configured_bandwidth({H200_UUID: 2.0e12, "0": 1.0e12}, 0, H200_UUID) == 2.0e12
    chosen = resolve_bandwidth("NVIDIA H200", 0, H200_UUID, 3201, 6016, {"0": 4.0e12})
    assert (chosen.bytes_per_second, chosen.source) == (4.0e12, "config")
    other_gpu = resolve_bandwidth("NVIDIA H200", 1, "GPU-y", 3201, 6016, {"0": 4.0e12})
    assert other_gpu.source == "table"


@pytest.mark.parametrize(
    ("override", "expected", "source"),
    [
        (None, 4.8e12, "table"),
        (4.2e12, 4.2e12, "config"),
        ({"0": 4.1e12}, 4.1e12, "config"),
        ({H200_UUID: 4.3e12}, 4.3e12, "config"),
    ],
)
async def test_collector_reports_bandwidth_and_its_source(
    override: float | dict[str, float] | None, expected: float, source: str
) -> None:
    config = GpuConfig(fake_file=[H200 / "nvml_2_loaded.json"], bandwidth_bytes_per_second=override)
    scrape = await NvmlCollector(config, Attribution([])).collect()
    got = {
        s.name: s
        for fam in scrape.metrics
        for s in fam.samples
        if s.name in ("llmb_gpu_info", "llmb_gpu_memory_bandwidth_bytes_per_second")
    }
    assert got["llmb_gpu_memory_bandwidth_bytes_per_second"].value == expected
    assert got["llmb_gpu_info"].labels["bandwidth_source"] == source
