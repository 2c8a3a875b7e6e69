"""CPU cost of the NVML background sampler: process CPU seconds per wall second.

Runs the NVML collector's sampler alone (no scrapes) for `--seconds` and reports
the process CPU time it used as a percentage of one core. Target: <= 1 %.

    python bench/nvml_sampling.py                    # fake backend: the H200 capture
    python bench/nvml_sampling.py --backend real     # the GPU of this machine (pynvml)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a plain script from a checkout

from config.settings import EngineConfig, GpuConfig  # noqa: E402
from exporter.attribution import Attribution  # noqa: E402
from exporter.collectors.nvml.backend import NvmlBackend, NvmlFileBackend, PynvmlBackend  # noqa: E402
from exporter.collectors.nvml.collector import NvmlCollector  # noqa: E402

DEFAULT_FAKE = ROOT / "tests/fixtures/llamacpp-h200-gemma3-27b-shape-q4_0/nvml_3_generating.json"


async def measure(backend: NvmlBackend, seconds: float, interval: float) -> dict[str, float]:
    """Run the sampler for `seconds` and return samples, wall and CPU figures."""
    engines = [EngineConfig(name="llama", kind="llamacpp", url="http://127.0.0.1:8080")]
    collector = NvmlCollector(
        GpuConfig(sample_interval_seconds=interval), Attribution(engines), backend=backend
    )
    first = await collector.collect()  # initializes NVML outside the measured span
    if not first.up:
        raise SystemExit(f"NVML not usable: {first.errors[0]}")
    before = collector.samples_total
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await collector.start()
    await asyncio.sleep(seconds)
    await collector.close()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    samples = collector.samples_total - before
    return {
        "samples": samples,
        "wall_seconds": round(wall, 3),
        "cpu_seconds": round(cpu, 4),
        "cpu_percent_of_one_core": round(100 * cpu / wall, 3),
        "cpu_us_per_sample": round(1e6 * cpu / max(samples, 1), 1),
    }


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the measurement, print the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("fake", "real"), default="fake")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=0.1, help="sample interval (s)")
    parser.add_argument("--fake-file", type=Path, default=DEFAULT_FAKE)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    backend: NvmlBackend = (
        PynvmlBackend() if args.backend == "real" else NvmlFileBackend([args.fake_file])
    )
    result = asyncio.run(measure(backend, args.seconds, args.interval))
    report = {
        "backend": args.backend,
        "interval_seconds": args.interval,
        "python": platform.python_version(),
        **result,
    }
    if args.json:
        print(json.dumps(report))
    else:
        for key, val in report.items():
            print(f"{key}: {val}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
