"""Fixtures for the simulators (sim area).

`sim_server(kind, scenario="healthy", **opts)` starts a simulator in-process (inside the
test's event loop) on a free 127.0.0.1 port and returns a `SimHandle` with `.url`,
`.gpu_state_file` (written every ~100 ms), `.log_file` (llama.cpp) and `.sim` (the simulator
object, e.g. `.sim.engine`). Keyword options are `llmb-sim` flags with dashes turned into
underscores: `time_scale=0.05`, `parallel=4`, `ctx_size=4096`, `n_gpu_layers=30`,
`kv_unified=True`, `tokenizer="char4"`, `api_key="k"`, `no_metrics=True`, `no_slots=True`,
`load_seconds=2`, `metric_spelling="underscore"`, `enable_cache_report=True`,
`fault=["error_rate=0.5"]`, `fault_seed=1`. The default
time scale is 0.05 (20x faster than real time). Servers stop at the end of the test.

    async def test_x(sim_server):
        h = await sim_server("llamacpp", "kv_saturated", parallel=4)
        httpx.get(h.url + "/metrics")
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from simulator.__main__ import build_parser, make_sim, options_from_args
from simulator.common import SimBase


@dataclass
class SimHandle:
    """A running simulator."""

    url: str
    port: int
    gpu_state_file: Path
    log_file: Path | None
    sim: SimBase


# The `sim_server` fixture's type: `await sim_server(kind, scenario="healthy", **opts)`.
SimServer = Callable[..., Awaitable[SimHandle]]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sim_argv(kind: str, scenario: str, port: int, **opts: Any) -> list[str]:
    """`llmb-sim` arguments for keyword options (True -> bare flag)."""
    argv = ["--kind", kind, "--scenario", scenario, "--port", str(port)]
    opts.setdefault("time_scale", 0.05)
    for key, value in opts.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):  # repeatable flags such as fault=[...]
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv


@pytest.fixture
async def sim_server(tmp_path: Path) -> AsyncIterator[SimServer]:
    """Factory: `await sim_server(kind, scenario="healthy", **opts)` -> SimHandle."""
    runners: list[web.AppRunner] = []
    count = 0

    async def start(kind: str, scenario: str = "healthy", **opts: Any) -> SimHandle:
        nonlocal count
        count += 1
        port = _free_port()
        state = tmp_path / f"sim{count}-{kind}-gpu.json"
        opts.setdefault("gpu_state_file", state)
        log = tmp_path / f"sim{count}-{kind}.log" if kind == "llamacpp" else None
        if log is not None:
            opts.setdefault("log_file", log)
        args = build_parser().parse_args(sim_argv(kind, scenario, port, **opts))
        sim = make_sim(options_from_args(args))
        runner = web.AppRunner(sim.build_app(), handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        return SimHandle(f"http://127.0.0.1:{port}", port, Path(opts["gpu_state_file"]), log, sim)

    yield start
    for runner in runners:
        await runner.cleanup()


def shape_diff(actual: Any, expected: Any, path: str = "$") -> list[str]:
    """Differences in keys and JSON value types between two documents (values ignored).

    Lists compare their first elements when both are non-empty; ints and floats differ
    (JSON `1` vs `1.0` matter to typed clients); `null` matches only `null`.
    """

    def kind(v: Any) -> str:
        return "float" if isinstance(v, float) else type(v).__name__

    if kind(actual) != kind(expected):
        return [f"{path}: {kind(actual)} != {kind(expected)}"]
    if isinstance(expected, dict):
        out = []
        for key in expected.keys() - actual.keys():
            out.append(f"{path}.{key}: missing")
        for key in actual.keys() - expected.keys():
            out.append(f"{path}.{key}: unexpected")
        for key in expected.keys() & actual.keys():
            out += shape_diff(actual[key], expected[key], f"{path}.{key}")
        return out
    if isinstance(expected, list) and expected and actual:
        return shape_diff(actual[0], expected[0], f"{path}[0]")
    return []
