"""Several NVML reading files of one GPU folded into one (one file per simulator).

The rules are in docs/metrics.md ("GPU readings from files"); `NvmlFileBackend` applies them.
"""

from __future__ import annotations

from typing import Any


def merge_device(target: dict[str, Any], dev: dict[str, Any], procs: list[dict[str, Any]]) -> None:
    """Fold a later file's reading of the same GPU into the first (rules: docs/metrics.md)."""
    target["procs"] = target["procs"] + procs
    for key in ("mem", "mem_v2"):
        if isinstance(target.get(key), dict) and isinstance(dev.get(key), dict):
            mem = dict(target[key])
            mem["used"] = int(mem["used"]) + int(dev[key]["used"])
            hidden = int(mem.get("reserved") or 0)
            mem["free"] = max(0, int(mem["total"]) - hidden - int(mem["used"]))
            target[key] = mem
    if isinstance(target.get("util"), dict) and isinstance(dev.get("util"), dict):
        target["util"] = {
            k: max(float(target["util"].get(k, 0)), float(dev["util"].get(k, 0)))
            for k in ("gpu", "memory")
        }
