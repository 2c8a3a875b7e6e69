"""Which limit binds while requests wait on SGLang (KV pool, running cap, prefill), and SGLang
residency beyond its KV pool: the decision core and promtool on the same samples.

Each synthetic engine holds one situation for 6 minutes of 15 s scrapes; promtool must agree
with `core` on every condition and verdict at every step, and on every recorded
input exactly (the parity harness of tests/system/test_verdict_parity.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.conditions import POOL_ACTION, Verdict
from core.promql import EngineKey
from core.rules import verdicts_at
from tests.paths import ROOT
from tests.system.test_verdict_parity import promtool_test
from tools.gpu_report import Key

GIB = 1 << 30
STEP = 15.0
STEPS = 25


def engine(name: str, kind: str = "sglang") -> tuple[tuple[str, str], ...]:
    return (("engine", name), ("host", "h"), ("kind", kind))


def sglang_engine(
    name: str,
    *,
    running: float,
    slots: float,
    waiting: float,
    used: float,
    capacity: float,
    per_request: tuple[float, float],
) -> dict[Key, list[float]]:
    """Gauges held constant; prompt/generation/finished counters growing at a steady rate."""
    lab = engine(name)
    finished_per_step = 0.5
    series: dict[Key, list[float]] = {
        ("llmb_engine_up", lab): [1.0] * STEPS,
        ("llmb_engine_loading", lab): [0.0] * STEPS,
        ("llmb_engine_requests_running", lab): [running] * STEPS,
        ("llmb_engine_requests_waiting", lab): [waiting] * STEPS,
        ("llmb_engine_slots", lab): [slots] * STEPS,
        ("llmb_engine_kv_cache_capacity_tokens", lab): [capacity] * STEPS,
        ("llmb_engine_kv_cache_used_tokens", lab): [used] * STEPS,
        ("llmb_engine_kv_cache_usage_ratio", lab): [used / capacity] * STEPS,
    }
    prompt, answer = per_request
    for metric, each in (
        ("llmb_engine_requests_finished_total", 1.0),
        ("llmb_engine_prompt_tokens_total", prompt),
        ("llmb_engine_generation_tokens_total", answer),
    ):
        series[(metric, lab)] = [i * finished_per_step * each for i in range(STEPS)]
    return series


def scrapes(*engines: dict[Key, list[float]]) -> list[tuple[float, dict[Key, float]]]:
    merged: dict[Key, list[float]] = {}
    for e in engines:
        merged.update(e)
    return [(i * STEP, {k: v[i] for k, v in merged.items()}) for i in range(STEPS)]


CASES: dict[str, dict[str, Any]] = {
    # One 1500-token request holds most of a 2048-token pool: 3 wait, usage 0.76 < 0.9,
    # running 1 of 48.
    "pool": dict(
        running=1.0, slots=48.0, waiting=3.0, used=1550.0, capacity=2048.0, per_request=(1500, 64)
    ),
    # Short requests whose answers SGLang reserves for: the pool holds little now, but
    # (running + 1) x (prompt + answer) does not fit.
    "reserved": dict(
        running=5.0, slots=48.0, waiting=4.0, used=3000.0, capacity=8192.0, per_request=(200, 1400)
    ),
    # At the cap (48 of 48) with a roomy pool: the cap binds.
    "cap": dict(
        running=48.0, slots=48.0, waiting=6.0, used=20000.0, capacity=400000.0,
        per_request=(300, 128),
    ),
    # Far below the cap with a roomy pool: prefill binds.
    "prefill": dict(
        running=4.0, slots=48.0, waiting=3.0, used=2000.0, capacity=400000.0,
        per_request=(400, 100),
    ),
}  # fmt: skip


def residency_engines() -> dict[Key, list[float]]:
    """Two SGLang engines on one GPU host: weights from safetensors (no weight series).

    `resident`: 46.06e9 B process memory = 43.93e9 B KV pool + 2.13e9 B (the H200 capture's
    numbers) for 0.78 GiB of weights. `offloaded`: the same pool, only 0.3 GiB beyond it.
    """
    out: dict[Key, list[float]] = {
        ("llmb_gpu_memory_total_bytes", (("gpu", "0"), ("host", "h"))): [150e9] * STEPS
    }
    for name, process in (("resident", 46.06e9), ("offloaded", 43.93e9 + 0.3 * GIB)):
        lab = engine(name)
        out[("llmb_engine_up", lab)] = [1.0] * STEPS
        out[("llmb_engine_process_gpu_memory_bytes", lab)] = [process] * STEPS
        out[("llmb_model_weights_bytes", lab)] = [0.78 * GIB] * STEPS
        out[("llmb_model_kv_cache_bytes_estimated", lab)] = [43.93e9] * STEPS
        out[("llmb_engine_requests_running", lab)] = [0.0] * STEPS
        out[("llmb_engine_requests_waiting", lab)] = [0.0] * STEPS
    # The engine's own KV figure, when reported, is preferred to the estimate.
    out[
        (
            "llmb_engine_kv_cache_bytes",
            (*engine("offloaded")[:2], ("device", "gpu"), ("kind", "sglang")),
        )
    ] = [43.93e9] * STEPS
    return out


@pytest.fixture(scope="module")
def parity(tmp_path_factory: pytest.TempPathFactory) -> dict[EngineKey, Verdict]:
    samples = scrapes(*(sglang_engine(n, **kw) for n, kw in CASES.items()), residency_engines())
    final, steps, result = promtool_test(
        [("sglang admission", samples, STEP)], tmp_path_factory.mktemp("admission")
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert steps == STEPS
    series = {k: [(t, s[k]) for t, s in samples if k in s] for k in samples[0][1]}
    verdicts = verdicts_at(series, (STEPS - 1) * STEP)
    assert {k.engine: v for k, v in final["sglang admission"].items()} == {
        k.engine: v.name for k, v in verdicts.items()
    }
    return verdicts


def by_engine(verdicts: dict[EngineKey, Verdict], name: str) -> Verdict:
    return next(v for k, v in verdicts.items() if k.engine == name)


def test_pool_binds_below_the_cap_with_usage_under_90_percent(
    parity: dict[EngineKey, Verdict],
) -> None:
    v = by_engine(parity, "pool")
    assert v.name == "kv_saturated"
    assert "pool_held" in v.evidence and "usage_and_queue" not in v.evidence
    assert "--mem-fraction-static" in v.action and "--max-total-tokens" in v.action
    assert "--max-running-requests" not in v.action
    # The answers' reserve: what the pool holds now is not the whole demand.
    r = by_engine(parity, "reserved")
    assert r.name == "kv_saturated" and r.evidence == ("pool_reserved",)
    assert r.action == v.action == POOL_ACTION


def test_max_running_requests_only_at_the_cap(parity: dict[EngineKey, Verdict]) -> None:
    v = by_engine(parity, "cap")
    assert v.name == "scheduling_bound"
    assert v.evidence == ("queue", "slots_full")
    assert "--max-running-requests" in v.action
    p = by_engine(parity, "prefill")
    assert p.name == "scheduling_bound" and p.evidence == ("queue", "prefill")
    assert "--chunked-prefill-size" in p.action and "--max-running-requests" not in p.action
    assert json.loads(json.dumps(p.to_dict()))["action"] == p.action


def test_residency_from_process_memory_beyond_the_kv_pool(
    parity: dict[EngineKey, Verdict],
) -> None:
    ok = by_engine(parity, "resident")
    assert not ok.held("weights_not_resident")
    bad = by_engine(parity, "offloaded")
    assert bad.name == "weights_not_resident" and bad.evidence == ("memory_beyond_kv",)


def test_rules_file_carries_the_new_evidence() -> None:
    text = (ROOT / "prometheus" / "rules" / "verdict.yml").read_text()
    for label in ("pool_held", "pool_reserved", "slots_full", "prefill", "memory_beyond_kv"):
        assert f'"evidence", "{label}"' in text
