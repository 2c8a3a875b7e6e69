"""Theoretical memory bandwidth of a GPU: the roofline that decode speed is measured against.

Decode of one sequence reads every weight once per token, so tokens/s can never
exceed bandwidth / bytes-read-per-token. NVML does not report that bandwidth;
it is taken, in order, from the configuration (`gpu.bandwidth_bytes_per_second`),
from the vendor figure of a known GPU matched on NVML's product name, or, as a
last resort, computed from NVML's memory clock and bus width.

Why clock x bus width is only a fallback: the formula needs the number of bits a
pin moves per reported clock, and NVML says neither the memory type nor that
factor. For HBM (HBM2e, HBM3, HBM3e) NVML reports a clock that carries two
transfers per cycle, and the formula with factor 2 lands within 0.3 % of the
datasheet (H200: 3201 MHz x 6016 bits / 8 x 2 = 4.814e12 B/s vs 4.8e12). GDDR is
different: GDDR6X signals with PAM4 (2 bits per symbol) and GDDR7 with PAM3
(1.5 bits per symbol) on top of a separate write clock, and what NVML calls the
memory clock for those parts has a different, generation- and driver-dependent
relation to the per-pin data rate, so the same factor can be off by 2x or more.
Hence the label `llmb_gpu_info{bandwidth_source}` says which figure is in use.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

BandwidthSource = Literal["config", "table", "clock_bus", "none"]

# HBM transfers per reported memory clock cycle (see the module docstring).
HBM_TRANSFERS_PER_CLOCK = 2

# (pattern on the normalized NVML name, bytes/s). First match wins, so specific
# variants come before the generic name. Figures are NVIDIA's product-page /
# datasheet numbers, cross-checked with public spec pages:
# - H200 (SXM and NVL) 4.8 TB/s: nvidia.com/en-us/data-center/h200; also
#   https://aiminingco.com/gpu/h200/specs ("141GB of HBM3e memory with 4.8 TB/s").
# - H100 SXM 3.35 TB/s, PCIe 2.0 TB/s, NVL 3.9 TB/s: nvidia.com/en-us/data-center/h100
#   (H100 SXM 3.35 also in https://lzwjava.github.io/nvidia-h200-gpu-specs-en).
# - A100: 40GB 1,555 GB/s; 80GB SXM 2,039 GB/s; 80GB PCIe 1,935 GB/s: A100 datasheet
#   (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), table reproduced in
#   https://www.thundercompute.com/blog/nvidia-a100-specs-full-guide.
# - L40S 864 GB/s, L4 300 GB/s, A10 600 GB/s, T4 320 GB/s, V100 900 GB/s: NVIDIA data-center
#   product pages/datasheets.
# - GeForce RTX 4090 1,008 GB/s, RTX 5090 1,792 GB/s, RTX 6000 Ada 960 GB/s,
#   RTX PRO 6000 Blackwell 1,792 GB/s: NVIDIA product pages.
# - RTX PRO 5000 Blackwell 1,344 GB/s for both 48 GB and 72 GB:
#   https://grokipedia.com/page/Nvidia_RTX_Pro_5000_Blackwell ("48 GB and 72 GB ... up to
#   1,344 GB/s"); the 72 GB model keeps the figure (pepelac.news, Dec 2025).
KNOWN_GPUS: tuple[tuple[str, float], ...] = (
    (r"\bh200\b", 4.8e12),
    (r"\bh100\b.*\bnvl\b", 3.9e12),
    (r"\bh100\b.*\bpcie\b", 2.0e12),
    (r"\bh100\b", 3.35e12),  # "NVIDIA H100 80GB HBM3" is the SXM part
    (r"\ba100\b.*\b80gb\b.*\bpcie\b", 1.935e12),
    (r"\ba100\b.*\bpcie\b.*\b80gb\b", 1.935e12),
    (r"\ba100\b.*\b80gb\b", 2.039e12),
    (r"\ba100\b.*\b40gb\b", 1.555e12),
    (r"\bl40s\b", 864e9),
    (r"\bl4\b", 300e9),
    (r"\brtx 4090\b(?!.*laptop)", 1.008e12),
    (r"\brtx 5090\b(?!.*laptop)", 1.792e12),
    (r"\brtx pro 6000 blackwell\b", 1.792e12),
    (r"\brtx pro 5000 blackwell\b", 1.344e12),
    (r"\brtx 6000 ada\b", 960e9),
    (r"\ba10g?\b", 600e9),
    (r"\bt4\b", 320e9),
    (r"\bv100\b", 900e9),  # \b keeps V100S (1,134 GB/s) out
)


@dataclass(frozen=True)
class Bandwidth:
    """A bandwidth figure and where it came from."""

    bytes_per_second: float | None
    source: BandwidthSource


def normalize_name(name: str) -> str:
    """Lower-case an NVML name with separators as spaces ('A100-SXM4-80GB' -> 'a100 sxm4 80gb')."""
    return " ".join(re.split(r"[\s\-_/]+", name.lower())).strip()


def table_bandwidth(name: str) -> float | None:
    """Vendor bandwidth of a known GPU, matched on its NVML product name."""
    normalized = normalize_name(name)
    for pattern, value in KNOWN_GPUS:
        if re.search(pattern, normalized):
            return value
    return None


def clock_bus_bandwidth(
    clock_mhz: float | None,
    bus_width_bits: int | None,
    transfers_per_clock: float = HBM_TRANSFERS_PER_CLOCK,
) -> float | None:
    """clock x bus width / 8 x transfers per clock: exact for HBM, unreliable for GDDR."""
    if not clock_mhz or not bus_width_bits:
        return None
    return clock_mhz * 1e6 * bus_width_bits / 8 * transfers_per_clock


def configured_bandwidth(
    override: float | Mapping[str, float] | None, index: int, uuid: str
) -> float | None:
    """The config override for one GPU: a single value, or a value keyed by index or UUID."""
    if override is None:
        return None
    if isinstance(override, Mapping):
        for key in (uuid, str(index)):
            if key in override:
                return float(override[key])
        return None
    return float(override)


def resolve_bandwidth(
    name: str,
    index: int,
    uuid: str,
    max_clock_mhz: float | None,
    bus_width_bits: int | None,
    override: float | Mapping[str, float] | None = None,
) -> Bandwidth:
    """Bandwidth for one GPU: config, else the known-GPU table, else clock x bus width."""
    value = configured_bandwidth(override, index, uuid)
    if value is not None:
        return Bandwidth(value, "config")
    value = table_bandwidth(name)
    if value is not None:
        return Bandwidth(value, "table")
    # The maximum clock, not the current one: at idle the memory clock drops with the
    # performance state and the roofline must not move with it.
    value = clock_bus_bandwidth(max_clock_mhz, bus_width_bits)
    if value is not None:
        return Bandwidth(value, "clock_bus")
    return Bandwidth(None, "none")


# ------------------------------------------------------------------- peak compute (prefill)

# Dense tensor-core peaks (FLOP/s; INT8 in OP/s), never the "with sparsity" figures the
# datasheets print first (those are 2x). (pattern on the normalized NVML name, {dtype: peak}),
# first match wins as in KNOWN_GPUS. Sources:
# - H100 SXM / H200 SXM: BF16/FP16 989.5 T, FP8 and INT8 1,979 T (datasheets: 1,979 /
#   3,958 "with sparsity"); H100 NVL / H200 NVL 835 / 1,671; H100 PCIe 756 / 1,513
#   (nvidia.com/en-us/data-center/h100, /h200 spec tables, halved).
# - A100 (40/80 GB): BF16/FP16 312 T, INT8 624 T, no FP8 (A100 datasheet: 624 / 1,248 sparse).
# - L40S: BF16/FP16 362.05 T, FP8 and INT8 733 T (L40S datasheet: 733 / 1,466 sparse).
# - GeForce RTX 4090: BF16/FP16 (FP32 accumulate) 165.2 T, FP8 330.3 T, INT8 660.6 T (Ada
#   Lovelace architecture whitepaper, appendix table, dense column).
# - GeForce RTX 5090: BF16/FP16 (FP32 accumulate) 209.5 T, FP8 419 T, INT8 838 T (RTX
#   Blackwell architecture whitepaper, dense column).
# - RTX PRO 6000 Blackwell: 4 PFLOPS FP4 with sparsity (datasheet) -> FP4 2,000 T dense,
#   FP8 and INT8 1,000 T, BF16/FP16 500 T (each precision halving the rate).
# - RTX PRO 5000 Blackwell: 2,064 AI TOPS (FP4 with sparsity, datasheet) -> FP8 and INT8
#   516 T, BF16/FP16 258 T dense, by the same halving.
PEAK_DTYPES = ("bf16", "fp8", "int8")
KNOWN_PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"\bh200\b.*\bnvl\b", {"bf16": 835e12, "fp8": 1671e12, "int8": 1671e12}),
    (r"\bh200\b", {"bf16": 989.5e12, "fp8": 1979e12, "int8": 1979e12}),
    (r"\bh100\b.*\bnvl\b", {"bf16": 835e12, "fp8": 1671e12, "int8": 1671e12}),
    (r"\bh100\b.*\bpcie\b", {"bf16": 756e12, "fp8": 1513e12, "int8": 1513e12}),
    (r"\bh100\b", {"bf16": 989.5e12, "fp8": 1979e12, "int8": 1979e12}),
    (r"\ba100\b", {"bf16": 312e12, "int8": 624e12}),
    (r"\bl40s\b", {"bf16": 362.05e12, "fp8": 733e12, "int8": 733e12}),
    (r"\brtx 4090\b(?!.*laptop)", {"bf16": 165.2e12, "fp8": 330.3e12, "int8": 660.6e12}),
    (r"\brtx 5090\b(?!.*laptop)", {"bf16": 209.5e12, "fp8": 419e12, "int8": 838e12}),
    (r"\brtx pro 6000 blackwell\b", {"bf16": 500e12, "fp8": 1000e12, "int8": 1000e12}),
    (r"\brtx pro 5000 blackwell\b", {"bf16": 258e12, "fp8": 516e12, "int8": 516e12}),
)


def table_peak_flops(name: str) -> dict[str, float]:
    """Dense peak FLOP/s per dtype of a known GPU ({} when unknown), by its NVML name."""
    normalized = normalize_name(name)
    for pattern, peaks in KNOWN_PEAK_FLOPS:
        if re.search(pattern, normalized):
            return dict(peaks)
    return {}
