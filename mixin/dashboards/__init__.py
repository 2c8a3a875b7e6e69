"""The Grafana dashboards (grafana/dashboards/*.json), one module per dashboard.

panels.py holds the shared panel helpers, layout.py turns a Dashboard into Grafana JSON.
Every query names only series that the exporter, the load generator or a recording rule
produces, and every threshold line is read from the core's THRESHOLDS
(tests/integration/test_grafana.py checks both).
"""

from __future__ import annotations

from collections.abc import Callable

from mixin.config import MixinConfig
from mixin.dashboards import engines, fleet, gpu_memory, load_run, overview
from mixin.dashboards.layout import render
from mixin.dashboards.panels import Dashboard

DASHBOARDS_DIR = "grafana/dashboards"
# File name -> builder, in the order the dashboards are documented (docs/dashboards.md).
DASHBOARDS: dict[str, Callable[[MixinConfig], Dashboard]] = {
    "overview.json": overview.overview,
    "gpu-memory.json": gpu_memory.gpu_memory,
    "engines.json": engines.engines,
    "load-run.json": load_run.load_run,
    "fleet.json": fleet.fleet,
}


def dashboard_files(cfg: MixinConfig) -> dict[str, str]:
    """Repository path -> normalized JSON text of every dashboard."""
    return {f"{DASHBOARDS_DIR}/{name}": render(build(cfg)) for name, build in DASHBOARDS.items()}
