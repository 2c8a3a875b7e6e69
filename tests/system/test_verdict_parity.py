"""Parity: the Python decision core (`core/`) and the Prometheus rules give the
same verdict on the same samples.

Unit tests check the evaluator's PromQL absence semantics and the roofline on their own.
The integration tests capture real inputs:

* every simulator preset x engine kind: real simulator processes under load, read by the
  real exporter (one per simulated card, each with its own `host` label), whose `/metrics`
  is scraped every WALL_INTERVAL seconds and stamped SCRAPE_INTERVAL apart (the verdict
  depends on windows counted in samples and on ratios of counters, not on wall time);
* every captured real GPU run in `tests/fixtures/` (the exporter's real H200 scrapes).

Each capture becomes a promtool test whose input series are the samples and whose expected
values, at every step, are the Python evaluator's conditions and verdict for every engine,
and every recorded input of the verdict and the roofline to the last bit
(`tools/gpu_report.parity_case`). One `promtool test rules` run checks them all; the Python
verdict at the end of each capture must also be the bottleneck the scenario induces.
A hypothesis test does the same on real captures rescaled across the thresholds, with
series dropped and scrapes missing.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.conditions import CONDITIONS, VERDICT_INFO, VERDICTS, evaluate
from core.promql import EngineKey
from core.roofline import (
    MISFIT_REASONS,
    ModelStructure,
    RooflineFacts,
    active_weights_bytes,
    decode_batch,
    decode_bytes_per_step,
    decode_efficiency,
    expert_share,
    go_pow,
    roofline_facts,
    roofline_misfit,
    roofline_tokens_per_second,
    tp_bandwidth,
)
from core.rules import rule_values_at, verdicts_at
from core.signals import SIGNAL_FIELDS, SIGNAL_RECORDS, Signals
from core.thresholds import THRESHOLDS, threshold_number, threshold_seconds
from simulator.demo import PREFILL_LOADS
from simulator.scenarios import SCENARIOS
from tests.conftest import get_free_port
from tests.integration.test_sim_scenarios import words
from tests.paths import FIXTURES, ROOT
from tests.plugins.exporter import parse_samples
from tests.plugins.prom import stop_process
from tests.system.test_stack_integration import (
    EXPECTED,
    HF_CONFIGS,
    LOADS,
    PRESET,
    Load,
    wait_http,
    write_model_dirs,
)
from tools.gpu_report import (
    EXPECTED as GPU_EXPECTED,
)
from tools.gpu_report import (
    RULE_FILES,
    Key,
    find,
    group_order,
    parity_case,
    read_jsonl,
    scrape_series,
)

GPU_RUNS = ("h200-validation-2026-11-30", "h200x2-validation-2026-11-30")

# ---------------------------------------------------------------------------- unit tests


def test_every_verdict_has_a_condition_in_order_and_the_last_is_the_fallback() -> None:
    conds = [VERDICT_INFO[v].condition for v in VERDICTS]
    assert conds[-1] is None and None not in conds[:-1]
    assert [c for c in conds if c] == [c.name for c in CONDITIONS]
    assert all(VERDICT_INFO[v].action and VERDICT_INFO[v].summary for v in VERDICTS)


def test_signals_fields_map_to_recorded_series_the_rules_define() -> None:
    recorded = {
        r["record"]
        for f in ("recording.yml", "verdict.yml")
        for g in yaml.safe_load((ROOT / "prometheus" / "rules" / f).read_text())["groups"]
        for r in g["rules"]
    }
    assert set(SIGNAL_RECORDS) == set(SIGNAL_FIELDS) - {"host_has_gpu"}
    assert set(SIGNAL_RECORDS.values()) <= recorded
    assert {c.record for c in CONDITIONS} <= recorded


def test_absent_series_mirror_promql() -> None:
    # Nothing known: no condition holds, so the fallback (being at the limit needs evidence).
    assert evaluate(Signals()).name == "decode_below_card_limit"
    # idle needs running and waiting present; an absent generation rate counts as none.
    assert evaluate(Signals(running=0, waiting=0)).name == "idle"
    assert evaluate(Signals(running=0)).name == "decode_below_card_limit"
    assert evaluate(Signals(running=0, waiting=0, generation_tokens_per_second=0.1)).name == (
        "decode_below_card_limit"
    )
    # KV usage high but the queue average absent: the product is absent, not true.
    assert evaluate(Signals(kv_usage_avg=0.99)).name == "decode_below_card_limit"
    full = evaluate(Signals(kv_usage_avg=0.99, waiting_avg=1.0))
    assert full.name == "kv_saturated" and full.evidence == ("usage_and_queue",)
    # A queue with room in the KV cache is scheduling.
    assert evaluate(Signals(kv_usage_avg=0.5, waiting_avg=1.0)).name == "scheduling_bound"
    # Offload counts only on a host with a GPU.
    assert evaluate(Signals(layers_ratio=0.5)).name == "decode_below_card_limit"
    off = evaluate(Signals(layers_ratio=0.5, weights_memory_ratio=0.4, host_has_gpu=True))
    assert off.name == "weights_not_resident" and off.evidence == ("layers", "memory")


def test_decision_order_first_condition_wins() -> None:
    everything = Signals(
        layers_ratio=0.5,
        host_has_gpu=True,
        kv_usage_avg=1.0,
        waiting_avg=3.0,
        kv_pressure_increase=2.0,
        running=0,
        waiting=0,
        decode_efficiency=0.9,
        prompt_tokens_mean=4096,
        ttft_wait_share=0.6,
        prefill_time_share=0.8,
    )
    v = evaluate(everything)
    assert v.name == "weights_not_resident"
    # In decision order; prefill_at_card_limit needs little waiting, card_throttled a card
    # state, and decode at the card's limit yields to the prefill verdicts while long prompts
    # take most of the time: the only ones not held.
    held = {c.name: c.held for c in v.conditions}
    assert [c.name for c in v.conditions][:3] == ["weights_not_resident", "kv_saturated",
                                                  "ttft_waiting"]  # fmt: skip
    assert [n for n, h in held.items() if not h] == [
        "card_throttled",
        "prefill_at_card_limit",
        "decode_at_card_limit",
    ]
    assert evaluate(Signals(decode_efficiency=0.5)).name == "decode_at_card_limit"
    assert evaluate(Signals(decode_efficiency=0.4999)).name == "decode_below_card_limit"
    assert evaluate(Signals(kv_pressure_increase=0.0)).name == "decode_below_card_limit"


def test_verdict_as_json_names_every_condition_and_the_action() -> None:
    d = evaluate(Signals(kv_pressure_increase=3.0, waiting_avg=2.0)).to_dict()
    assert d["verdict"] == "kv_saturated" and d["evidence"] == ["pressure_events"]
    assert d["conditions"] == {
        "weights_not_resident": False,
        "kv_saturated": True,
        "requests_queueing": True,
        "idle": False,
        "card_throttled": False,
        "decode_at_card_limit": False,
        "ttft_waiting": False,
        "prefill_at_card_limit": False,
        "prefill_bound": False,
    }
    assert d["action"] == VERDICT_INFO["kv_saturated"].action
    json.dumps(d)


def test_thresholds_parse() -> None:
    assert threshold_seconds("rate_window") == 300 and threshold_seconds("queue_window") == 60
    assert threshold_number("gpu_headroom_min_bytes") == 536870912
    with pytest.raises(ValueError):
        threshold_number("rate_window")
    assert all(th.why for th in THRESHOLDS.values())


def test_roofline_counts_weights_and_kv_bytes() -> None:
    # The H200 capture: 15.2 GB Q4_0 weights at 4.8 TB/s -> 316 tok/s without KV.
    weights = 15197219840
    assert roofline_tokens_per_second(4.8e12, decode_bytes_per_step(weights)) == pytest.approx(
        315.8, abs=0.1
    )
    # 660 KV tokens at 80 KiB each add 54 MB to every step.
    step = decode_bytes_per_step(weights, 660, 81920)
    assert step == weights + 660 * 81920
    roof = roofline_tokens_per_second(4.8e12, step)
    assert roof is not None and roof < 4.8e12 / weights
    eff = decode_efficiency(94.8, roof)
    assert eff is not None and 0.29 < eff < 0.31
    assert roofline_tokens_per_second(None, step) is None
    assert roofline_tokens_per_second(4.8e12, 0) is None
    assert decode_efficiency(None, 300.0) is None and decode_efficiency(10.0, None) is None


# Qwen3-30B-A3B at Q8_0 (the shape of issue 17's H200 run), tensor by tensor: 48 layers,
# hidden 2048, 32 query heads and 4 KV heads of 128, 128 experts of 768 (8 used), vocabulary
# 151936 with an untied embedding; Q8_0 = 34 bytes per 32 weights, norms and router F32.
Q8 = 34 / 32
QWEN3_ATTN = (2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048) * Q8 + (2048 + 2048 + 128 + 128) * 4
QWEN3_ROUTER = 2048 * 128 * 4
QWEN3_ALWAYS = 48 * (QWEN3_ATTN + QWEN3_ROUTER) + 151936 * 2048 * Q8 + 2048 * 4
QWEN3_ROUTED = 48 * 3 * 128 * 2048 * 768 * Q8
QWEN3_EMBD = 151936 * 2048 * Q8
QWEN3_KV_PER_TOKEN = 48 * 4 * 128 * 2 * 2  # f16 K and V
QWEN3 = ModelStructure(
    weights_bytes=QWEN3_ALWAYS + QWEN3_ROUTED + QWEN3_EMBD,
    always_read_bytes=QWEN3_ALWAYS,
    routed_expert_bytes=QWEN3_ROUTED,
    experts=128,
    experts_used=8,
    token_embedding_row_bytes=2048 * Q8,
)


def test_the_issue_capture_is_beyond_physics_as_dense_and_below_the_limit_as_moe() -> None:
    """Issue 17: 238.6 tok/s measured on an H200 (4.8 TB/s) with Qwen3-30B-A3B Q8_0."""
    assert QWEN3.weights_bytes == pytest.approx(32.48e9, rel=0.001)
    kv_tokens = 128 + 64  # a 128-token prompt and half of 128 output tokens
    dense = decode_bytes_per_step(QWEN3.weights_bytes or 0, kv_tokens, QWEN3_KV_PER_TOKEN)
    assert dense == pytest.approx(32.47e9, rel=0.002)
    eff = decode_efficiency(238.6, roofline_tokens_per_second(4.8e12, dense))
    assert eff is not None and eff == pytest.approx(1.61, abs=0.01)
    v = evaluate(Signals(decode_efficiency=eff))
    assert v.name != "decode_at_card_limit" and not v.held("decode_at_card_limit")
    reason = roofline_misfit(eff, roofline_facts(QWEN3.weights_bytes or 0, None))
    assert reason is not None and reason.name == "model_structure_unknown"
    # The same capture against the bytes actually read: about 3.24 GB per token.
    moe = decode_bytes_per_step(QWEN3, kv_tokens, QWEN3_KV_PER_TOKEN)
    assert moe == pytest.approx(3.24e9, rel=0.02)
    limit = roofline_tokens_per_second(4.8e12, moe)
    assert limit == pytest.approx(1480, rel=0.02)
    eff = decode_efficiency(238.6, limit)
    assert eff == pytest.approx(0.16, abs=0.01)
    assert roofline_misfit(eff, roofline_facts(QWEN3, None)) is None
    assert evaluate(Signals(decode_efficiency=eff)).name == "decode_below_card_limit"


def test_moe_weights_per_step_grow_with_the_distinct_experts_of_the_batch() -> None:
    # 1 - (1 - k/E)^B: 8 of 128 at B=1 is 1/16; 16 sequences touch about 64.4 %.
    assert expert_share(128, 8, 1) == 8 / 128
    assert expert_share(128, 8, 16) == pytest.approx(1 - (120 / 128) ** 16)
    one = active_weights_bytes(QWEN3, 1)
    sixteen = active_weights_bytes(QWEN3, 16)
    assert one == QWEN3_ALWAYS + QWEN3_ROUTED * (8 / 128) + 2048 * Q8
    assert sixteen == pytest.approx(QWEN3_ALWAYS + 0.6439 * QWEN3_ROUTED + 16 * 2048 * Q8, rel=1e-3)
    # Experts known but not E/k: every routed expert counts; no structure: all weights.
    no_counts = ModelStructure(weights_bytes=1e9, always_read_bytes=4e8, routed_expert_bytes=5e8)
    assert active_weights_bytes(no_counts) == 9e8
    assert not no_counts.experts_known
    assert active_weights_bytes(ModelStructure(weights_bytes=1e9)) == 1e9
    # A dense model with an untied embedding reads B of its rows.
    dense = ModelStructure(
        weights_bytes=1e9,
        always_read_bytes=9e8,
        routed_expert_bytes=0.0,
        token_embedding_row_bytes=1000.0,
    )
    assert dense.experts_known and active_weights_bytes(dense, 4) == 9e8 + 4000.0
    # Whole sequences per step, at least one.
    assert [decode_batch(x) for x in (None, 0.0, 0.4, 1.5, 3.49)] == [1.0, 1.0, 1.0, 2.0, 3.0]


def test_go_pow_is_repeated_squaring_for_whole_exponents() -> None:
    for x in (0.9375, 0.5, 1 - 8 / 128, 1 - 4 / 32, 0.999, 0.0, 1.0):
        for n in (0, 1, 2, 3, 7, 16, 64, 255, 1024):
            got = go_pow(x, float(n))
            assert got == pytest.approx(x**n, rel=1e-14, abs=1e-300)
    # Go's math.Pow multiplies in this order; C's pow may differ in the last bit.
    x, want = 0.9375, 1.0
    base = x
    n = 16
    while n:
        if n & 1:
            want *= base
        base *= base
        n >>= 1
    assert go_pow(x, 16.0) == want


def test_speculative_decoding_multiplies_the_roofline_and_counts_the_draft() -> None:
    model = ModelStructure(
        weights_bytes=8e9, always_read_bytes=8e9, routed_expert_bytes=0.0, draft_weights_bytes=1e9
    )
    step = decode_bytes_per_step(model, batch=1, accept_length=3.0)
    assert step == 8e9 + 3e9  # the draft runs once per proposed token
    roof = roofline_tokens_per_second(4.8e12, step, 3.0)
    assert roof == pytest.approx(4.8e12 * 3 / 11e9)
    # An accept length below 1 (idle SGLang) counts as one token per step.
    assert roofline_tokens_per_second(4.8e12, 8e9, 0.0) == 4.8e12 / 8e9
    fast = decode_efficiency(4.8e12 / 8e9 * 2.5, roofline_tokens_per_second(4.8e12, 8e9))
    facts = roofline_facts(replace(model, draft_weights_bytes=None), None)
    reason = roofline_misfit(fast, facts)
    assert reason is not None and reason.name == "speculative_decoding_not_detected"
    facts = RooflineFacts(True, True, True)
    assert roofline_misfit(fast, facts).name == "bandwidth_too_low"  # type: ignore[union-attr]
    assert roofline_misfit(1.1, facts) is None and roofline_misfit(None, facts) is None
    assert [r.name for r in MISFIT_REASONS][-1] == "bandwidth_too_low"


def test_tensor_parallel_bandwidth_is_the_sum_for_an_even_split() -> None:
    assert tp_bandwidth([(4.8e12, 10.0)]) == 4.8e12
    assert tp_bandwidth([(4.8e12, 10.0), (4.8e12, 10.0)]) == 9.6e12
    # The slowest share sets the pace; a stray context on a third GPU cannot add to it.
    assert tp_bandwidth([(4.8e12, 12.0), (4.8e12, 8.0)]) == pytest.approx(4.8e12 / 0.6)
    three = tp_bandwidth([(4.8e12, 10.0), (4.8e12, 10.0), (4.8e12, 0.5)])
    assert three == pytest.approx(4.8e12 / (10 / 20.5))
    assert tp_bandwidth([]) is None and tp_bandwidth([(4.8e12, 0.0)]) is None


def test_the_2_gpu_capture_uses_both_gpus_bandwidth() -> None:
    scrapes = _fixture_scrapes("h200x2-validation-2026-11-30", "split2_layer")
    series = {}
    for at, samples in scrapes:
        for key, v in samples.items():
            series.setdefault(key, []).append((at, v))
    ((key, values),) = rule_values_at(series, scrapes[-1][0]).items()
    gpus = {
        dict(k[1])["gpu"] for k in scrapes[-1][1] if k[0] == "llmb_gpu_process_memory_used_bytes"
    }
    assert gpus == {"0", "1"}
    # -ts 1,1: about half of the engine's memory on each H200, so nearly 2 x 4.8 TB/s.
    assert values.bandwidth_bytes_per_second is not None
    assert 9.0e12 < values.bandwidth_bytes_per_second <= 9.6e12
    assert values.decode_bytes_per_step is not None
    assert values.roofline_tokens_per_second == pytest.approx(
        values.bandwidth_bytes_per_second / values.decode_bytes_per_step
    )
    assert evaluate(values.signals).name == "decode_below_card_limit" and values.misfit is None


def test_signals_from_samples_follow_promql_windows() -> None:
    """Counters and gauges of one engine, evaluated like the rules at t = 300 s."""
    lab = (("engine", "e"), ("kind", "llamacpp"))
    series: dict[Key, list[tuple[float, float]]] = {
        ("llmb_engine_up", lab): [(t, 1.0) for t in range(0, 301, 15)],
        ("llmb_engine_requests_waiting", lab): [
            (t, 1.0 if t == 240 else 0.0) for t in range(0, 301, 15)
        ],
        ("llmb_engine_generation_tokens_total", lab): [(t, 10.0 * t) for t in range(0, 301, 15)],
        ("llmb_engine_kv_pressure_events_total", (*lab, ("event", "x"))): [
            (t, 0.0) for t in range(0, 301, 15)
        ],
    }
    (sig,) = rule_values_at(series, 300).values()
    # avg_over_time over [240, 300]: the sample at 240 is inside (Prometheus 2.x), 1 of 5.
    assert sig.signals.waiting_avg == pytest.approx(1 / 5)
    assert sig.signals.generation_tokens_per_second == pytest.approx(10.0)
    assert sig.signals.kv_pressure_increase == 0.0
    assert sig.signals.host_has_gpu is False
    # Engines that are not up have no verdict.
    series[("llmb_engine_up", lab)] = [(t, 0.0) for t in range(0, 301, 15)]
    assert rule_values_at(series, 300) == {}
    assert verdicts_at(series, 300) == {}


@pytest.mark.prometheus
def test_a_queue_average_at_the_threshold_rounds_as_in_prometheus(tmp_path: Path) -> None:
    """Waiting 0,0,2,0,0,1 averages to 0.5 on paper; Prometheus' compensated mean gives
    0.49999999999999994, so requests are not queueing. A plain running mean says 0.5."""
    lab = (("engine", "e"), ("host", "h"), ("kind", "sglang"))
    waiting = [0.0] * 5 + [0.0, 0.0, 2.0, 0.0, 0.0, 1.0]
    scrapes = []
    for i, w in enumerate(waiting):
        samples: dict[Key, float] = {
            ("llmb_engine_up", lab): 1.0,
            ("llmb_engine_requests_running", lab): 2.0,
            ("llmb_engine_requests_waiting", lab): w,
            ("llmb_engine_kv_cache_usage_ratio", lab): 0.3,
        }
        scrapes.append((12.0 * i, samples))
    final, _, result = promtool_test([("queue at the threshold", scrapes, 12.0)], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    ((key, verdict),) = final["queue at the threshold"].items()
    assert verdict == "decode_below_card_limit"
    series = {k: [(12.0 * i, s[k]) for i, (_, s) in enumerate(scrapes)] for k in scrapes[0][1]}
    waiting_avg = rule_values_at(series, 120.0)[key].signals.waiting_avg
    assert waiting_avg == 0.49999999999999994


# ------------------------------------------------------------------ simulator captures

KINDS = ("llamacpp", "sglang")
SCRAPE_INTERVAL = 15.0  # seconds between samples in the promtool input
WALL_INTERVAL = 0.5  # real seconds between scrapes
STEPS = 36  # 9 minutes of samples: the 5m rate window fills, then the verdict holds
# Real time per simulated second; 16 simulators share a 2-core CI machine with the exporters.
TIME_SCALE = "1"
# Presets whose name is no bottleneck (sized like the real captures): a modest load and
# parity only.
EXTRA_LOAD = Load(1, 256, 64)
# Issue 17's presets (simulator/scenarios.py, synth-sim): the model's structure served by the
# simulator itself (a header-only GGUF / an HF folder), and the verdict the roofline must give.
ROOFLINE_PRESETS = {
    "moe_below_limit": "decode_below_card_limit",
    "moe_at_limit": "decode_at_card_limit",
    "moe_experts_on_host": "weights_not_resident",
    "spec_decode": "decode_at_card_limit",
    "kv_quantized": "decode_at_card_limit",
}
# The kinds whose collector exports that structure on this branch (SGLang's comes with issue
# 18's collector): for the others, parity only.
ROOFLINE_KINDS = ("llamacpp",)
# The at-limit presets decode at 300+ tok/s: one client keeps a 2-core machine in step.
ROOFLINE_LOAD = Load(1, 64, 128)
# Issue 27's card-state presets: NVML says the card is slowed, on every engine kind alike.
CARD_PRESETS = {"card_throttled": "card_throttled"}
# Gemma 3 27B shape as an HF config.json, for SGLang's KV estimate.
HF_CONFIGS_27B = {
    "num_hidden_layers": 62,
    "hidden_size": 5376,
    "num_attention_heads": 32,
    "num_key_value_heads": 16,
    "head_dim": 128,
}


@dataclass(frozen=True)
class SimRun:
    """One engine: its name, preset, load and the verdict it must get (None: parity only)."""

    name: str
    kind: str
    preset: str
    load: Load | None
    intended: str | None


def sim_runs() -> list[SimRun]:
    """Every preset x engine kind (plus the unloaded healthy engine, which is idle)."""
    runs = []
    for scenario in LOADS:
        for kind in KINDS:
            runs.append(
                SimRun(
                    f"{kind}-{scenario}",
                    kind,
                    PRESET[scenario],
                    LOADS[scenario][kind],
                    EXPECTED[scenario],
                )
            )
    for preset in SCENARIOS:
        if preset in PREFILL_LOADS:
            # Issue 27: long prompts; the verdict on both engines.
            load, verdict = PREFILL_LOADS[preset]
            runs += [SimRun(f"{k}-{preset}", k, preset, load, verdict) for k in KINDS]
        elif preset in ROOFLINE_PRESETS:
            for kind in KINDS:
                intended = ROOFLINE_PRESETS[preset] if kind in ROOFLINE_KINDS else None
                runs.append(SimRun(f"{kind}-{preset}", kind, preset, ROOFLINE_LOAD, intended))
        elif preset in CARD_PRESETS:
            runs += [
                SimRun(f"{k}-{preset}", k, preset, EXTRA_LOAD, CARD_PRESETS[preset]) for k in KINDS
            ]
        elif preset not in PRESET.values():
            runs += [SimRun(f"{k}-{preset}", k, preset, EXTRA_LOAD, None) for k in KINDS]
    return runs


def test_every_simulator_preset_and_engine_is_covered() -> None:
    covered = {(r.preset, r.kind) for r in sim_runs()}
    assert covered == {(p, k) for p in SCENARIOS for k in KINDS}


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


@dataclass
class Capture:
    """The simulator captures: (time, samples) per exporter host, and the engines."""

    scrapes: dict[str, list[tuple[float, dict[Key, float]]]] = field(default_factory=dict)
    runs: dict[str, SimRun] = field(default_factory=dict)


async def _drive(run: SimRun, url: str, stop: asyncio.Event) -> None:
    """Closed-loop load: `concurrency` workers, each sending the next request when done."""
    assert run.load is not None
    load = run.load

    async def worker(i: int, client: httpx.AsyncClient) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            prompt = words(load.prompt_tokens, f"{run.name}-{i}-{n}")
            body: dict[str, Any]
            if run.kind == "llamacpp":
                path = "/completion"
                body = {"prompt": prompt, "n_predict": load.max_tokens, "ignore_eos": True}
            else:
                path = "/generate"
                params = {"max_new_tokens": load.max_tokens, "ignore_eos": True}
                body = {"text": prompt, "sampling_params": params}
            try:
                await client.post(path, json=body)
            except httpx.HTTPError:
                await asyncio.sleep(0.1)

    limits = httpx.Limits(max_connections=load.concurrency + 1)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        await asyncio.gather(*(worker(i, client) for i in range(load.concurrency)))


async def _capture(
    runs: dict[str, SimRun], urls: dict[str, str], exporters: dict[str, str]
) -> dict[str, list[tuple[float, dict[Key, float]]]]:
    stop = asyncio.Event()
    loads = [asyncio.create_task(_drive(runs[n], urls[n], stop)) for n in runs if runs[n].load]
    out: dict[str, list[tuple[float, dict[Key, float]]]] = {h: [] for h in exporters}
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            start = time.monotonic()
            for step in range(STEPS):
                await asyncio.sleep(max(0.0, start + step * WALL_INTERVAL - time.monotonic()))
                texts = await asyncio.gather(
                    *(client.get(url + "/metrics") for url in exporters.values())
                )
                for host, resp in zip(exporters, texts, strict=True):
                    resp.raise_for_status()
                    out[host].append((step * SCRAPE_INTERVAL, parse_samples(resp.text)))
    finally:
        stop.set()
        for task in loads:
            task.cancel()
        await asyncio.gather(*loads, return_exceptions=True)
    return out


@pytest.fixture(scope="module")
def sim_capture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Capture]:
    """Start every simulator and one exporter per simulated card, load, scrape, stop."""
    workdir = tmp_path_factory.mktemp("parity")
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (workdir / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    capture = Capture()
    try:
        model_dirs = write_model_dirs(workdir, {**HF_CONFIGS, "27b": HF_CONFIGS_27B})
        engines: dict[str, list[dict[str, Any]]] = {}
        states: dict[str, list[str]] = {}
        started = []
        urls = {}
        for run in sim_runs():
            port = get_free_port()
            state = workdir / f"{run.name}.nvml.json"
            argv = [sys.executable, "-m", "simulator", "--kind", run.kind, "--port", str(port)]
            argv += ["--scenario", run.preset, "--gpu-state-file", str(state)]
            argv += ["--time-scale", TIME_SCALE]
            engine: dict[str, Any] = {"name": run.name, "kind": run.kind}
            engine["url"] = urls[run.name] = f"http://127.0.0.1:{port}"
            if run.kind == "llamacpp":
                log = workdir / f"{run.name}.llama-server.log"
                argv += ["--log-file", str(log)]
                engine["log_file"] = str(log)
            elif run.preset not in ROOFLINE_PRESETS and run.preset not in PREFILL_LOADS:
                # (those serve their own model folder)
                model = SCENARIOS[run.preset].model
                size = "32b" if model.n_layer == 64 else "27b" if model.n_layer == 62 else "8b"
                engine["model_path"] = str(model_dirs[size])
            host = _slug(SCENARIOS[run.preset].gpu.name)
            engines.setdefault(host, []).append(engine)
            states.setdefault(host, []).append(str(state))
            started.append((run, spawn(run.name, argv)))
            capture.runs[run.name] = run
        for run, proc in started:
            wait_http(f"{urls[run.name]}/health", 120, proc, run.name)
        exporters = {}
        for host, group in engines.items():
            port = get_free_port()
            config = {
                "listen": f"127.0.0.1:{port}",
                "host": host,
                "engines": group,
                "gpu": {"fake_file": states[host], "sample_interval_seconds": 0.2},
            }
            path = workdir / f"exporter-{host}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            argv = [sys.executable, "-m", "exporter", "--config", str(path)]
            proc = spawn(f"exporter-{host}", argv)
            exporters[host] = f"http://127.0.0.1:{port}"
            wait_http(f"{exporters[host]}/metrics", 120, proc, f"exporter {host}")
        capture.scrapes = asyncio.run(_capture(capture.runs, urls, exporters))
        yield capture
    finally:
        for proc in reversed(procs):
            stop_process(proc)


# ----------------------------------------------------------- fuzzed inputs (hypothesis)


def _fixture_scrapes(run: str, scenario: str) -> list[tuple[float, dict[Key, float]]]:
    folder = FIXTURES / run / scenario
    return scrape_series(read_jsonl(find(folder, "scrapes.jsonl")))


# Series rescaled by a factor drawn from these, to push the real values across thresholds
# (KV usage to 0.9, queue to 0.5, layers and memory below the weights, decode efficiency
# from the captures' 0.3 to 0.5).
FUZZ_SCALES = {
    "llmb_engine_kv_cache_usage_ratio": [1.0, 0.0, 0.9, 0.95, 1.05, 3.0, 12.0, 20.0],
    "llmb_engine_requests_waiting": [1.0, 0.0, 0.1, 0.125, 0.5, 2.0],
    "llmb_engine_gpu_layers_offloaded": [1.0, 1.0, 1.0, 0.99],
    "llmb_engine_process_gpu_memory_bytes": [1.0, 1.0, 1.0, 0.8],
    "llmb_engine_model_buffer_bytes": [1.0, 1.0, 1.0, 0.85],
    "llmb_engine_decode_seconds_total": [1.0, 0.2, 0.3, 0.6, 2.0, 0.05],
    "llmb_gpu_memory_bandwidth_bytes_per_second": [1.0, 1.0, 0.3],
}
# Series a fuzzed capture may lose entirely: the evaluator must treat absence as PromQL does.
FUZZ_DROPPABLE = (
    "llmb_engine_requests_running",
    "llmb_engine_requests_waiting",
    "llmb_engine_kv_cache_usage_ratio",
    "llmb_engine_kv_pressure_events_total",
    "llmb_engine_gpu_layers_total",
    "llmb_engine_model_buffer_bytes",
    "llmb_engine_generation_tokens_total",
    "llmb_engine_decode_seconds_total",
    "llmb_engine_kv_cache_used_tokens",
    "llmb_model_kv_bytes_per_token_estimated",
    "llmb_model_weights_bytes",
    "llmb_gpu_memory_total_bytes",
    "llmb_gpu_memory_bandwidth_bytes_per_second",
    "llmb_gpu_process_memory_used_bytes",
    "llmb_model_experts",
    "llmb_model_weights_routed_experts_bytes",
    "llmb_engine_spec_accept_length",
)


def with_series(
    scrapes: list[tuple[float, dict[Key, float]]], extra: dict[str, float]
) -> list[tuple[float, dict[Key, float]]]:
    """The capture with per-engine series added (labels of its `llmb_engine_up`) to every
    scrape; a value is a fraction of the capture's weight bytes when the name says bytes."""
    out = []
    for at, samples in scrapes:
        new = dict(samples)
        for key in samples:
            if key[0] != "llmb_engine_up":
                continue
            weights = samples.get(("llmb_model_weights_bytes", key[1]), 1.0)
            for name, v in extra.items():
                new[(name, key[1])] = v * weights if name.endswith("_bytes") else v
        out.append((at, new))
    return out


# An MoE model with experts offloaded to the host (the routed experts' share read there).
_EXPERT_OFFLOAD: dict[str, float] = {
    "llmb_model_weights_always_read_bytes": 0.04,
    "llmb_model_weights_routed_experts_bytes": 0.95,
    "llmb_model_experts": 128,
    "llmb_model_experts_used": 8,
    "llmb_engine_experts_host_layers": 20,
    "llmb_engine_experts_host_bytes": 0.4,
}
# Model structures over a capture's weight bytes (fractions), speculative decoding and
# expert offload: the new arithmetic of the roofline under the same promtool parity.
STRUCTURES: dict[str, dict[str, float]] = {
    "none": {},
    "moe": {
        "llmb_model_weights_always_read_bytes": 0.04,
        "llmb_model_weights_routed_experts_bytes": 0.95,
        "llmb_model_experts": 128,
        "llmb_model_experts_used": 8,
        "llmb_model_token_embedding_row_bytes": 1e-7,
    },
    "moe_no_counts": {
        "llmb_model_weights_always_read_bytes": 0.04,
        "llmb_model_weights_routed_experts_bytes": 0.95,
    },
    "dense_untied": {
        "llmb_model_weights_always_read_bytes": 0.97,
        "llmb_model_weights_routed_experts_bytes": 0.0,
        "llmb_model_token_embedding_row_bytes": 3e-7,
    },
    "speculative": {
        "llmb_model_weights_always_read_bytes": 1.0,
        "llmb_model_weights_routed_experts_bytes": 0.0,
        "llmb_model_draft_weights_bytes": 0.05,
        "llmb_engine_spec_accept_length": 2.4,
    },
    "expert_offload": {
        **_EXPERT_OFFLOAD,
        # The exporter's copy at start (model/host_memory.py): the bound's numerator.
        "llmb_host_memory_bandwidth_bytes_per_second": 4.15e10,
    },
    # No bandwidth series: no bound on either side (no constant stands in).
    "expert_offload_unmeasured": _EXPERT_OFFLOAD,
}


@st.composite
def fuzzed_capture(draw: st.DrawFn) -> list[tuple[float, dict[Key, float]]]:
    """A real H200 capture with series rescaled near the thresholds, series dropped and
    scrapes missing."""
    run = draw(st.sampled_from(GPU_RUNS))
    names = sorted(n for n in GPU_EXPECTED if (FIXTURES / run / n).exists())
    scrapes = _fixture_scrapes(run, draw(st.sampled_from(names)))
    scrapes = with_series(scrapes, STRUCTURES[draw(st.sampled_from(sorted(STRUCTURES)))])
    scale = {name: draw(st.sampled_from(f)) for name, f in FUZZ_SCALES.items()}
    dropped = draw(st.sets(st.sampled_from(FUZZ_DROPPABLE), max_size=3))
    missing = draw(st.sets(st.integers(1, len(scrapes) - 2), max_size=4))
    out = []
    for i, (t, samples) in enumerate(scrapes):
        if i in missing:
            continue
        new = {}
        for key, v in samples.items():
            if key[0] in dropped:
                continue
            new[key] = v * scale.get(key[0], 1.0)
        out.append((t, new))
    return out


def promtool_test(
    cases: list[tuple[str, list[tuple[float, dict[Key, float]]], float]], workdir: Path
) -> tuple[dict[str, dict[EngineKey, str]], int, subprocess.CompletedProcess[str]]:
    """Write one promtool file per capture (expectations from Python) and run them at once.

    Returns Python's verdicts at the last step of each capture, the number of steps
    checked, and promtool's result.
    """
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run scripts/install.sh"
    final = {}
    steps = 0
    files = []
    for i, (name, scrapes, interval) in enumerate(cases):
        pc = parity_case(name, scrapes, interval, every_step=True, exact_values=True)
        final[name] = pc.final
        steps += len(pc.verdicts)
        doc = {
            "rule_files": [str(ROOT / "prometheus" / "rules" / f) for f in RULE_FILES],
            "evaluation_interval": pc.case["interval"],
            "group_eval_order": group_order(),
            "tests": [pc.case],
        }
        path = workdir / f"parity-{i:02d}.yml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1 << 20))
        files.append(str(path))
    result = subprocess.run(
        [promtool, "test", "rules", *files], capture_output=True, text=True, timeout=300
    )
    return final, steps, result


@pytest.mark.prometheus
@settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(fuzzed_capture())
def test_fuzzed_real_captures_give_the_same_verdict(
    capture: list[tuple[float, dict[Key, float]]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _, steps, result = promtool_test([("fuzzed H200 capture", capture, 1.0)], Path(tmp))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert steps >= 10


def issue_capture(structure: bool) -> list[tuple[float, dict[Key, float]]]:
    """The real H200 single-request capture at issue 17's numbers: Qwen3-30B-A3B Q8_0 weights
    (32.48 GB), decode at ~238 tok/s; with or without the model's expert structure."""
    scrapes = _fixture_scrapes("h200-validation-2026-11-30", "resident_c1")
    # Memory and weight buffers grow with the weights: still all resident.
    grow = ("llmb_engine_process_gpu_memory_bytes", "llmb_engine_model_buffer_bytes")
    out = []
    for at, samples in scrapes:
        new = {}
        old = next(v for k, v in samples.items() if k[0] == "llmb_model_weights_bytes")
        for key, v in samples.items():
            if key[0] == "llmb_model_weights_bytes":
                v = QWEN3.weights_bytes or 0.0
            elif key[0] in grow:
                v = v * (QWEN3.weights_bytes or 0.0) / old
            elif key[0] == "llmb_engine_decode_seconds_total":
                v = v * 94.8 / 238.6  # the capture's 94.8 tok/s -> 238.6
            new[key] = v
        out.append((at, new))
    if not structure:
        return out
    return with_series(
        out,
        {
            "llmb_model_weights_always_read_bytes": QWEN3_ALWAYS / (QWEN3.weights_bytes or 1),
            "llmb_model_weights_routed_experts_bytes": QWEN3_ROUTED / (QWEN3.weights_bytes or 1),
            "llmb_model_experts": 128,
            "llmb_model_experts_used": 8,
            "llmb_model_token_embedding_row_bytes": 2048 * Q8 / (QWEN3.weights_bytes or 1),
        },
    )


@pytest.mark.prometheus
def test_promtool_gates_the_issue_capture_like_python(tmp_path: Path) -> None:
    cases = [("dense assumption", issue_capture(False), 1.0), ("moe", issue_capture(True), 1.0)]
    final, _, result = promtool_test(cases, tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert list(final["dense assumption"].values()) == ["decode_below_card_limit"]
    assert list(final["moe"].values()) == ["decode_below_card_limit"]
    series: dict[Key, list[tuple[float, float]]] = {}
    for at, samples in issue_capture(False):
        for key, v in samples.items():
            series.setdefault(key, []).append((at, v))
    last = max(p[-1][0] for p in series.values())
    ((_, dense),) = rule_values_at(series, last).items()
    assert dense.misfit == "model_structure_unknown"
    assert dense.signals.decode_efficiency is not None and dense.signals.decode_efficiency > 1.1
    series = {}
    for at, samples in issue_capture(True):
        for key, v in samples.items():
            series.setdefault(key, []).append((at, v))
    ((_, moe),) = rule_values_at(series, last).items()
    assert moe.misfit is None and moe.active_weights_bytes is not None
    assert moe.active_weights_bytes == pytest.approx(3.27e9, rel=0.01)
    assert moe.signals.decode_efficiency == pytest.approx(0.16, abs=0.02)


@pytest.mark.prometheus
def test_promtool_computes_every_structure_like_python(tmp_path: Path) -> None:
    """Each structure on each real capture, unscaled and with decode 5x faster (beyond
    physics for the dense assumption), checked at every step."""
    cases = []
    for run in GPU_RUNS:
        for name in ("resident_c1", "split2_layer"):
            if not (FIXTURES / run / name).exists():
                continue
            base = _fixture_scrapes(run, name)
            fast = [
                (
                    at,
                    {
                        k: v * (0.2 if k[0] == "llmb_engine_decode_seconds_total" else 1.0)
                        for k, v in s.items()
                    },
                )
                for at, s in base
            ]
            for label, struct in STRUCTURES.items():
                cases.append((f"{run} {name} {label}", with_series(base, struct), 1.0))
                cases.append((f"{run} {name} {label} fast", with_series(fast, struct), 1.0))
    final, steps, result = promtool_test(cases, tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert len(final) == 2 * 2 * len(STRUCTURES) and steps > 100
    offload = [v for n, v in final.items() if "expert_offload" in n and "ngl" not in n]
    assert all(list(v.values()) == ["weights_not_resident"] for v in offload)


# ------------------------------------------------------------------------ the parity run


@dataclass
class ParityRun:
    """Python's verdict at the end of every capture and promtool's result on all of them."""

    final: dict[str, dict[EngineKey, str]]
    steps_checked: int
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def parity(sim_capture: Capture, tmp_path_factory: pytest.TempPathFactory) -> ParityRun:
    """Every capture as a promtool test (expectations from Python), one promtool run."""
    cases = [(f"simulators on {h}", s, SCRAPE_INTERVAL) for h, s in sim_capture.scrapes.items()]
    for run in GPU_RUNS:
        for name in sorted(GPU_EXPECTED):
            if (FIXTURES / run / name).exists():
                cases.append((f"{run} {name}", _fixture_scrapes(run, name), 1.0))
    final, steps, result = promtool_test(cases, tmp_path_factory.mktemp("promtool"))
    return ParityRun(final, steps, result)


@pytest.mark.prometheus
@pytest.mark.timeout(900)
def test_promtool_agrees_with_python_at_every_step_of_every_capture(parity: ParityRun) -> None:
    out = parity.result.stdout + parity.result.stderr
    assert parity.result.returncode == 0, out[-6000:]
    # One exporter per simulated card and 6 GPU scenarios, every step of each.
    cards = len({_slug(s.gpu.name) for s in SCENARIOS.values()})
    assert len(parity.final) == cards + 6
    assert parity.steps_checked >= cards * STEPS + 6 * 15


@pytest.mark.prometheus
@pytest.mark.timeout(900)
def test_python_verdict_is_the_induced_bottleneck_on_every_simulator(
    parity: ParityRun, sim_capture: Capture
) -> None:
    got = {}
    for name, verdicts in parity.final.items():
        if name.startswith("simulators on "):
            got |= {key.engine: v for key, v in verdicts.items()}
    assert set(got) == set(sim_capture.runs), "an engine was not up at the end"
    want = {n: r.intended for n, r in sim_capture.runs.items() if r.intended}
    assert {n: got[n] for n in want} == want


@pytest.mark.prometheus
@pytest.mark.timeout(900)
def test_python_verdict_is_the_induced_bottleneck_on_every_gpu_capture(parity: ParityRun) -> None:
    checked = 0
    for run in GPU_RUNS:
        for name, intended in GPU_EXPECTED.items():
            verdicts = parity.final.get(f"{run} {name}")
            if verdicts is None:
                continue
            assert list(verdicts.values()) == [intended], (run, name)
            checked += 1
    assert checked == 6
