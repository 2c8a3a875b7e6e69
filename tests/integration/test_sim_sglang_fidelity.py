"""The SGLang simulator follows the real server, version by version.

0.5.11: the real CPU server's capture (tests/fixtures/sglang-0.5.11-cpu) and the real H200 run
(tests/fixtures/sglang-0.5.11-h200); tests/system/test_sglang_real.py holds it to the live server.
0.5.23: the captures rendered by SGLang 0.5.23's own metric classes (tests/fixtures/sglang-0.5.23).
Compared: the family set, each family's type, label names and histogram buckets (values and
label values are the simulator's own). A difference fails the test unless it is listed in
KNOWN_SIM_DIFFERENCES with its reason, and a listed one that no longer occurs fails it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from simulator.__main__ import build_parser, make_sim, options_from_args
from simulator.sglang.spec import VERSIONS
from tests.conftest import get_free_port
from tests.integration.test_sim_sglang import drive_busy
from tests.paths import FIXTURES

FIXTURES = FIXTURES
# version -> (capture, whether its load retracted, evicted and aborted: then the simulator gets
# tests/integration/test_sim_sglang.py's busy load on a small pool, else a few plain requests)
CAPTURES: dict[str, tuple[tuple[Path, bool], ...]] = {
    "0.5.11": (
        (FIXTURES / "sglang-0.5.11-cpu" / "metrics-after-load.txt", False),
        (FIXTURES / "sglang-0.5.11-h200" / "metrics-busy-c64.txt", False),
    ),
    "0.5.23": ((FIXTURES / "sglang-0.5.23" / "metrics-busy.txt", True),),
}

# (type, label names, histogram bucket bounds)
Shape = tuple[str, frozenset[str], tuple[float, ...]]

# difference (as shape_differences writes it) -> why the simulator differs from the real server
KNOWN_SIM_DIFFERENCES: dict[str, dict[str, str]] = {
    "0.5.11": {},
    "0.5.23": {},
}


def shapes(text: str) -> dict[str, Shape]:
    """Each family of an exposition: type, label names (without `le`), bucket bounds."""
    out: dict[str, Shape] = {}
    for fam in text_string_to_metric_families(text):
        labels: set[str] = set()
        bounds: set[float] = set()
        for s in fam.samples:
            labels |= set(s.labels) - {"le"}
            if "le" in s.labels:
                bounds.add(float(s.labels["le"]))
        out[fam.name] = (fam.type, frozenset(labels), tuple(sorted(bounds)))
    return out


def shape_differences(actual: dict[str, Shape], expected: dict[str, Shape]) -> list[str]:
    """What `actual` has that `expected` has not, and the other way round (sorted)."""
    out = [f"extra family {n}" for n in actual.keys() - expected.keys()]
    out += [f"missing family {n}" for n in expected.keys() - actual.keys()]
    for name in actual.keys() & expected.keys():
        (a_type, a_labels, a_bounds), (e_type, e_labels, e_bounds) = actual[name], expected[name]
        if a_type != e_type:
            out.append(f"{name}: type {a_type}, real {e_type}")
        if a_labels != e_labels:
            out.append(
                f"{name}: labels extra {sorted(a_labels - e_labels)} "
                f"missing {sorted(e_labels - a_labels)}"
            )
        if a_bounds != e_bounds:
            out.append(f"{name}: buckets {list(a_bounds)}, real {list(e_bounds)}")
    return sorted(out)


async def _load(url: str) -> None:
    """A streamed chat, a plain completion twice (a cache hit) and a /generate: the lazy families
    a load without retraction, eviction or abort writes appear."""
    async with httpx.AsyncClient(timeout=30) as client:
        chat = {"model": "m", "messages": [{"role": "user", "content": "hello there"}],
                "max_tokens": 8, "stream": True, "ignore_eos": True}  # fmt: skip
        async with client.stream("POST", url + "/v1/chat/completions", json=chat) as resp:
            async for _ in resp.aiter_lines():
                pass
        plain = {"model": "m", "prompt": "hello there", "max_tokens": 8, "ignore_eos": True}
        for _ in range(2):  # the second one hits the prefix cache
            (await client.post(url + "/v1/completions", json=plain)).raise_for_status()
        gen = {"text": "hi", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
        (await client.post(url + "/generate", json=gen)).raise_for_status()


async def simulated(version: str, *paths: str, busy: bool = False) -> dict[str, Any]:
    """Start `llmb-sim --kind sglang --sglang-version VERSION` in-process, load it, and return
    its `/metrics` text and the JSON of `paths`."""
    port = get_free_port()
    args = build_parser().parse_args(
        ["--kind", "sglang", "--port", str(port), "--time-scale", "0.05",
         "--sglang-version", version, "--scenario", "kv_saturated" if busy else "healthy"]
    )  # fmt: skip
    runner = web.AppRunner(make_sim(options_from_args(args)).build_app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}"
    try:
        if busy:
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                await drive_busy(client)
        else:
            await _load(url)
        async with httpx.AsyncClient(timeout=30) as client:
            out: dict[str, Any] = {"/metrics": (await client.get(url + "/metrics")).text}
            for path in paths:
                out[path] = (await client.get(url + path)).json()
        return out
    finally:
        await runner.cleanup()


async def simulated_shapes(version: str, busy: bool = False) -> dict[str, Shape]:
    """The family shapes of the simulator answering as `version`, after a load."""
    return shapes((await simulated(version, busy=busy))["/metrics"])


def test_every_version_has_captures() -> None:
    assert set(CAPTURES) == set(VERSIONS) == set(KNOWN_SIM_DIFFERENCES)


@pytest.mark.parametrize(
    ("version", "capture", "busy"),
    [(v, p, busy) for v, paths in CAPTURES.items() for p, busy in paths],
    ids=lambda x: x.parent.name if isinstance(x, Path) else str(x),
)
async def test_simulator_writes_the_families_of_the_real_release(
    version: str, capture: Path, busy: bool
) -> None:
    text = capture.read_text()  # noqa: ASYNC240 (a small fixture file)
    sim = await simulated_shapes(version, busy)
    real = shapes(text)
    assert shape_differences(sim, real) == sorted(KNOWN_SIM_DIFFERENCES[version])


def test_known_differences_have_reasons() -> None:
    for version, known in KNOWN_SIM_DIFFERENCES.items():
        assert all(len(why) > 20 for why in known.values()), version


async def test_simulator_answers_0_5_11_endpoints_with_the_real_keys() -> None:
    """/server_info (and its internal_states, memory_usage) and /get_model_info keys as 0.5.11
    answers them on the CPU; 0.5.23's model_info as its capture."""
    real = FIXTURES / "sglang-0.5.11-cpu"
    real_info = json.loads((real / "server_info.json").read_text())
    model = json.loads((real / "get_model_info.json").read_text())
    endpoints = FIXTURES / "sglang-0.5.23-endpoints"
    new_model = json.loads((endpoints / "model_info.json").read_text())
    got = await simulated("0.5.11", "/server_info", "/get_model_info")
    info = got["/server_info"]
    # The simulator answers a subset of the ~370 start arguments, plus its `simulated` mark.
    assert set(info) - {"simulated"} <= set(real_info)
    state, real_state = info["internal_states"][0], real_info["internal_states"][0]
    assert set(state) <= set(real_state)
    assert set(state["memory_usage"]) == set(real_state["memory_usage"])
    assert info["version"] == real_info["version"] == "0.5.11"
    assert set(got["/get_model_info"]) == set(model)
    new = await simulated("0.5.23", "/model_info", "/server_info")
    assert set(new["/model_info"]) == set(new_model)
    assert new["/server_info"]["version"] == "0.5.23"
    assert {"launch_command", "startup_time"} <= set(new["/server_info"])
