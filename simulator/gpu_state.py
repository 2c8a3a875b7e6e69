"""NVML-shaped JSON the exporter's fake NVML backend reads (format of nvml_3_generating.json)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulator.engine import Engine

DRIVER = "580.159.04"
NVML = "13.580.159.04"
# Memory the driver holds on an idle card besides `reserved` (from nvml_1_baseline.json).
BASELINE_USED = 9240576
# The idle SM clock and NVML's reason for it (nvml_1_baseline.json; nvml.h bit values).
IDLE_SM_CLOCK_MHZ = 345
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4


def snapshot(engine: Engine, pid: int, cmdline: str, index: int = 0) -> dict[str, Any]:
    """One NVML sample of the simulated card with this simulator as its only process.

    `index` is the card's NVML index; cards of different indexes get different UUIDs, so
    two simulators on indexes 0 and 1 are two cards (each sized to its own preset).
    """
    gpu = engine.gpu
    uuid = gpu.uuid if index == 0 else f"{gpu.uuid[:-4]}{index:04x}"
    used_proc = engine.process_gpu_bytes()
    used_v2 = BASELINE_USED + used_proc
    free = gpu.total_bytes - used_v2 - gpu.reserved_bytes
    busy = bool(engine.running)
    util = engine.utilization if busy else 0.0
    power = gpu.idle_power_mw + int((gpu.max_power_mw - gpu.idle_power_mw) * (0.6 if busy else 0))
    if busy and gpu.busy_clock_reasons & SW_POWER_CAP:
        power = gpu.max_power_mw  # held at its limit
    return {
        "t": time.time(),
        "driver": DRIVER,
        "nvml": NVML,
        "devices": [
            {
                "index": index,
                "name": gpu.name,
                "uuid": uuid,
                "mem": {
                    "total": gpu.total_bytes,
                    "used": used_v2 + gpu.reserved_bytes,
                    "free": free,
                },
                "mem_v2": {
                    "total": gpu.total_bytes,
                    "used": used_v2,
                    "free": free,
                    "reserved": gpu.reserved_bytes,
                },
                "util": {"gpu": 92 if busy else 0, "memory": round(100 * util)},
                "bus_width": gpu.bus_width,
                "power_mw": power,
                "power_limit_mw": gpu.max_power_mw,
                # At its stock limit: the default and the highest limit are the enforced one.
                "power_default_limit_mw": gpu.max_power_mw,
                "power_max_limit_mw": gpu.max_power_mw,
                "temp": gpu.busy_temp_c if busy else 36,
                "max_mem_clock_mhz": gpu.mem_clock_mhz,
                "mem_clock_mhz": gpu.mem_clock_mhz,
                # Idle: the SM clock drops and NVML says why (GPU idle), as on the H200.
                "sm_clock_mhz": gpu.busy_sm_clock_mhz if busy else IDLE_SM_CLOCK_MHZ,
                "max_sm_clock_mhz": gpu.max_sm_clock_mhz,
                "clocks_event_reasons": gpu.busy_clock_reasons if busy else GPU_IDLE,
                "procs": [{"pid": pid, "used": used_proc, "cmdline": cmdline}],
                "memoryinfo_call_us": 7.5,
                "procs_call_us": 36.4,
            }
        ],
    }


def write_atomic(path: Path, doc: dict[str, Any]) -> None:
    """Write JSON so a reader never sees a half-written file (temp file + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
