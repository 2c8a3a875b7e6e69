"""`compare` against the engine simulators, launched through real launch templates.

Three pairs: different precisions of one model (Q4_0 llama.cpp vs bf16 SGLang on the seed's
72 GB card) must not be compared raw; the same model at `-np 1` vs `-np 8` must be told apart
by batching at the concurrency where it shows; two identical engines must say `stay` (the
engine in use) at every load. The simulators share one NVML-shaped GPU file, as two engines
measured one after the other share one GPU.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from cli.loadgen import main as loadgen_main
from config.settings import Config, parse_config
from core.slo import parse_slo
from diagnose.cli import run_info, write_outputs
from diagnose.decide import redecide
from diagnose.decision.model import INCONCLUSIVE, STAY, Decision, EngineResult, switch_to
from diagnose.decision.two_engines import CompareInputs
from diagnose.options import Options
from diagnose.procedure import compare
from tests.conftest import get_free_port


def sim_config(tmp_path: Path, *engines: tuple[str, str, str, str]) -> Config:
    """(name, kind, scenario, flags) simulators with launch templates and one GPU file."""
    state = tmp_path / "gpu.json"
    entries = []
    for name, kind, scenario, flags in engines:
        log = " --log-file {log}" if kind == "llamacpp" else ""
        entries.append(
            {
                "name": name,
                "kind": kind,
                "url": f"http://127.0.0.1:{get_free_port()}",
                "launch": {
                    "command": f"{sys.executable} -m simulator --scenario {scenario} --kind {kind}"
                    f" --port {{port}} --gpu-state-file {state}{log} {flags}",
                    "ready_timeout_seconds": 60,
                    "settle_seconds": 0.3,
                },
            }
        )
    return parse_config(
        {"engines": entries, "gpu": {"fake_file": str(state), "sample_interval_seconds": 0.1}},
        environ={},
    )


def options(cfg: Config, **kw: Any) -> Options:
    base: dict[str, Any] = {
        "concurrency": [1, 8],
        "prompt_tokens": 64,
        "max_tokens": 32,
        "rounds": 3,
        "contexts": [],
        "kv_prompt_tokens": 0,
        "gpu": cfg.gpu,
    }
    base.update(kw)
    return Options(**base)


def compare_pair(
    tmp_path: Path, a: tuple[str, str, str, str], b: tuple[str, str, str, str], **kw: Any
) -> tuple[list[EngineResult], Decision]:
    """`compare` in process over two simulated engines (sim_config's tuples), out in out/."""
    cfg = sim_config(tmp_path, a, b)
    return asyncio.run(
        compare((cfg.engines[0], cfg.engines[1]), options(cfg, **kw), tmp_path / "out")
    )


def test_different_precisions_are_not_comparable(tmp_path: Path) -> None:
    """The rtx-pro-5000-27b pair: llama.cpp Q4_0 (14.2 GiB) vs SGLang bf16 (51.1 GiB)."""
    preset = "rtx-pro-5000-27b"
    a, b = ("llama", "llamacpp", preset, ""), ("sglang", "sglang", preset, "")
    results, d = compare_pair(tmp_path, a, b, concurrency=[1, 4], rounds=2)
    assert d.comparable is False
    assert d.recommendation == INCONCLUSIVE
    why = next(c for c in d.caveats if c.startswith("different precision"))
    assert "llama serves Q4_0" in why and "> 20 %" in why
    comp = next(s for s in d.steps if s.key == "comparability")
    assert comp.decisive and "Share of the card's decode limit: llama" in comp.answer
    # The per-roofline comparison: both engines' shares of the same card's limit.
    llama, sglang = results
    for e in results:
        assert e.roofline.efficiency is not None and 0 < e.roofline.efficiency < 1.1
        assert e.bandwidth_bytes_per_s == pytest.approx(1.344e12)
    # Each engine estimated at the other's precision, labelled as an estimate.
    est = {e.engine: e for e in d.estimates}
    assert set(est) == {"llama", "sglang"}
    assert est["llama"].at_precision_of == "sglang"
    assert est["llama"].tok_s == pytest.approx(
        llama.roofline.efficiency * sglang.roofline.limit_tok_s  # type: ignore[operator]
    )
    assert all(e.basis.startswith("estimate:") for e in d.estimates)
    assert "run both on the same weights" in d.action


def test_better_batching_is_recommended_at_that_concurrency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same model at -np 1 (in use) and -np 8: equal alone, 8 slots win at 8 requests."""
    cfg = sim_config(
        tmp_path,
        ("np1", "llamacpp", "healthy", "-np 1 -c 8192"),
        ("np8", "llamacpp", "healthy", "-np 8 -c 65536"),
    )
    cfg_file = tmp_path / "config.json"
    cfg_file.write_text(json.dumps(cfg.model_dump(mode="json", exclude_none=True)))
    out = tmp_path / "out"
    code = loadgen_main(
        ["compare", "--config", str(cfg_file), "--engine", "np1", "--engine", "np8",
         "--out", str(out), "--concurrency", "1,8", "--prompt-tokens", "64",
         "--max-tokens", "32", "--kv-prompt-tokens", "0"]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    doc = json.loads((out / "results.json").read_text())
    assert doc["recommendation"] == switch_to("np8"), printed
    assert doc["comparable"] is True
    assert doc["verdict"]["np1"] == "scheduling_bound"
    # Eight requests wait for one slot on np1; np8 runs them (at most a hand-over wait).
    waiting = {
        e["name"]: next(r["waiting_avg"] for r in e["rows"] if r["concurrency"] == 8)
        for e in doc["engines"]
    }
    assert waiting["np1"] > 3 and waiting["np8"] < 1, waiting
    batching = next(s for s in doc["decision"]["steps"] if s["key"] == "batching")
    assert batching["decisive"]
    agg = next(c for c in batching["numbers"]["calls"] if c["what"] == "aggregate tok/s")
    assert agg["concurrency"] == 8 and agg["winner"] == "np8" and agg["b"] > 2 * agg["a"]
    # Single-request decode is the same model on the same card: no winner there.
    single = next(s for s in doc["decision"]["steps"] if s["key"] == "decode")
    assert not single["decisive"]
    # The terminal says the same, once.
    assert re.search(r"^recommendation +switch_to:np8$", printed, re.M)
    assert "switch to np8: at c=8" in printed
    assert printed.count("recommendation") == 1
    assert doc["command"].startswith("llmb-loadgen compare --config")
    assert "switch_to:np8" in (out / "report.md").read_text()


def test_two_identical_engines_say_stay_at_every_load(tmp_path: Path) -> None:
    same = ("llamacpp", "healthy", "-np 4")
    # compare's default --rounds 3: the bootstrap resamples the rounds, the waves of 4
    # requests and the requests, and nothing under 5 % is called.
    results, d = compare_pair(tmp_path, ("a", *same), ("b", *same), concurrency=[1, 4], rounds=3)
    assert d.comparable is True
    assert d.recommendation == STAY, d.action
    assert d.action.startswith("stay on a: no difference beyond the noise at c=1, c=4"), d.action
    batching = next(s for s in d.steps if s.key == "batching")
    assert "bootstrap over" in batching.answer and not batching.decisive
    assert [lv.winner for lv in d.loads] == [None, None]
    assert d.loads[0].what == "end-to-end s per request" and "TTFT" in d.loads[0].beside
    # The saved folder re-decided at each load: stay, saying where.
    write_outputs(tmp_path / "out", results, d, run_info([]), "same")
    for load in (1, 2, 4, 16):
        _, at = redecide(tmp_path / "out", None, CompareInputs(load=load))
        assert at.recommendation == STAY, at.action
        assert at.action.startswith(f"stay on a: no difference beyond the noise at c={load}")
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["recommendation"] == "stay"
    assert "**Recommendation:** `stay`" in (tmp_path / "out" / "report.md").read_text()


def test_the_crossover_is_found_within_one_measured_level(tmp_path: Path) -> None:
    """The `crossover` preset: llama.cpp (in use) is ahead alone, SGLang batches 32 sequences
    with a heavier step (about 0.6x alone, so ahead from c=2 on). One round: the requests
    alone decide, each level with an interval."""
    a, b = ("llama", "llamacpp", "crossover", ""), ("sglang", "sglang", "crossover", "")
    results, d = compare_pair(
        tmp_path, a, b, concurrency=[1, 2, 4, 8], rounds=1, requests_per_slot=4
    )
    winners = {lv.concurrency: lv.winner for lv in d.loads}
    assert winners[1] == "llama" and winners[4] == winners[8] == "sglang", d.loads
    # The true crossover is between 1 and 2: found at 2, or at 4 when c=2 is within the noise.
    assert d.crossover in (2, 4), d.loads
    assert all(lv.ratio_lo is not None and lv.ratio_hi is not None for lv in d.loads)
    assert d.recommendation == switch_to("sglang")  # no --load: the highest load decides
    per_load = next(s for s in d.steps if s.key == "per_load")
    # "c=1: llama ahead (+30 % [...]" or "(1.5× [...]" (or "c=1–2: ..." when llama still
    # leads at 2): the lead is as large as the loaded host makes it.
    assert per_load.answer.startswith("c=1") and "llama ahead (" in per_load.answer
    assert "sglang ahead" in per_load.answer
    # The saved folder re-decided for a single user (its rows name their requests' steps).
    write_outputs(tmp_path / "out", results, d, run_info([]), "crossover")
    engines, at1 = redecide(tmp_path / "out", None, CompareInputs(load=1))
    assert [e.name for e in engines] == ["llama", "sglang"]
    assert all(r.record_steps for e in engines for r in e.ok_rows("concurrency"))
    assert at1.recommendation == "stay_and_tune" and at1.load == 1


def test_diagnose_find_max_bisects_to_the_highest_load_within_the_slo(tmp_path: Path) -> None:
    """llama.cpp with one slot (`crossover`): each request waits for the ones ahead, so the
    end-to-end time grows with the load (about 0.25 s a request of 32 tokens); the SLO
    falls between the measured 2 and 8, and bisection finds the level where it breaks. A
    p50 is judged from 6 requests (5 per slot: c=2 can be judged, c=1 cannot). The SLO's
    interval resamples waves of `concurrency` requests as blocks, and the first wave is a
    ramp-up (its requests wait for 0..7 ahead, not 7): with 3 waves a resample draws it
    three times in 1 of 27, inside a 95 % interval, and c=8 is not judged; 5 waves judge."""
    from diagnose.procedure import diagnose

    cfg = sim_config(tmp_path, ("llama", "llamacpp", "crossover", ""))
    slo = parse_slo("e2e_p50=1.4s")
    opts = options(
        cfg, concurrency=[1, 2, 8], rounds=1, slo=slo, find_max=True, requests_per_slot=5
    )
    result, d = asyncio.run(diagnose(cfg.engines[0], opts, tmp_path / "out"))
    probed = sorted({r.concurrency for r in result.ok_rows("concurrency")} - {2, 8})
    assert probed and all(2 < c < 8 for c in probed)
    assert d.slo is not None
    best = d.slo.max_within["llama"]
    assert best is not None and 2 < best < 8, d.slo.text()
    # The level above the answer was measured and misses the SLO: the bisection closed.
    steps = {s.concurrency: s for s in d.slo.steps["llama"]}
    # The level above misses it, or sits so near the limit that its interval holds it (then
    # the bisection stops there and says so).
    assert steps[best].met is True and steps[best + 1].met is not True
    conc = next(s for s in d.steps if s.key == "concurrency")
    assert f"highest load within e2e_p50=1.4s: c={best}" in conc.answer
    if steps[best + 1].met is None:
        why = "could not be judged: the limit lies within its interval"
        assert f"c={best + 1} {why}" in conc.answer
    # Every probe had enough requests to judge a p50 (6): none lacks requests.
    assert all(steps[c].requests >= 6 and not steps[c].needs for c in probed)
    assert steps[1].met is None and steps[1].needs == {"e2e_p50": 6}
    slo_step = next(s for s in d.steps if s.key == "slo")
    assert f"llama meets it up to c={best}" in slo_step.answer
