"""`llmb-loadgen decide`: the H200 runs of docs/results re-decided from their requests.

The contract of issue 26: a saved compare folder (results.json + requests.jsonl) decided
again with today's code. `seed-27b-16bit/` (one round) and `same-weights/` (two rounds) are
real runs of SGLang and llama.cpp on one H200; llama.cpp is the engine in use (the seed's
question: should I switch to SGLang?).
"""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Any

import pytest

from cli.loadgen import main
from core.slo import parse_slo
from diagnose.decision.one_engine import decide_single
from diagnose.decision.requests import load_requests
from diagnose.decision.results import engine_from_dict
from diagnose.decision.slo import with_slo
from tests.paths import ROOT

RESULTS = ROOT / "docs" / "results" / "h200-sglang-vs-llamacpp-2026-12-01"
SEED = RESULTS / "seed-27b-16bit"
SAME = RESULTS / "same-weights"


def decide(tmp_path: Path, folder: Path, *flags: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"  # a new one each call
    assert main(["decide", str(folder), "--in-use", "llama", *flags, "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return doc, (out / "report.md").read_text(encoding="utf-8")


def levels(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {lv["concurrency"]: lv for lv in doc["decision"]["loads"]}


@pytest.mark.parametrize("folder", [SEED, SAME])
def test_every_load_row_gets_its_requests(folder: Path) -> None:
    doc = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    engines = [engine_from_dict(e) for e in doc["engines"]]
    reqs = load_requests(folder, engines)
    for e in engines:
        for row in e.ok_rows():
            if row.step in ("single", "concurrency"):
                rounds = reqs[e.name].rounds(e, row)
                assert len(rounds) == max(1, len(row.aggregate_rounds))
                assert sum(len(r) for r in rounds) == row.requests


def test_seed_sglang_ahead_at_16_and_64_with_intervals(tmp_path: Path, capsys: Any) -> None:
    doc, _ = decide(tmp_path, SEED, "--load", "64")
    lv = levels(doc)
    for c in (16, 64):
        assert lv[c]["winner"] == "sglang" and lv[c]["ratio_lo"] > 1.05
        assert "[" in lv[c]["lead"]
    # One round of two waves of 64: the waves are resampled as blocks, so the interval is
    # wider than the requests alone would make it, and still far above 1.
    assert 4.5 < lv[64]["ratio_lo"] <= 6.74 <= lv[64]["ratio_hi"] < 9.5
    assert "1 round in waves of 64" in lv[64]["basis"]
    assert doc["recommendation"] == "switch_to:sglang"
    assert "6.7× [" in doc["action"]
    assert "recommendation  switch_to:sglang" in capsys.readouterr().out


def test_seed_within_e2e_p99_5s(tmp_path: Path) -> None:
    doc, _ = decide(tmp_path, SEED, "--slo", "e2e_p99=5s")
    slo = doc["decision"]["slo"]
    steps = {e: {s["concurrency"]: s for s in v} for e, v in slo["steps"].items()}
    # llama misses it at 16 and 64 with confidence (every request over 5 s) ...
    assert steps["llama"][16]["observed"]["e2e_p99"] == pytest.approx(9.1, abs=0.05)
    assert steps["llama"][16]["met"] is False and steps["llama"][64]["met"] is False
    assert steps["llama"][16]["bounds"]["e2e_p99"][0] > 5
    # ... but one round of 2-128 requests bounds no p99 from above: nothing meets it with
    # confidence, and each level says how many requests it would need.
    assert steps["llama"][4]["met"] is None and steps["llama"][4]["needs"] == {"e2e_p99": 368}
    assert steps["sglang"][64]["observed"]["e2e_p99"] == pytest.approx(4.5, abs=0.05)
    assert steps["sglang"][64]["met"] is None and steps["sglang"][64]["share"] == 1.0
    assert steps["sglang"][64]["goodput_rps"] > 10
    assert slo["max_within"] == {"llama": None, "sglang": None}
    assert "c=64: not judged (e2e_p99: 128 requests, a p99 needs 368)" in slo_text(doc)
    # The SLO tells nothing apart with confidence: speed decides (sglang 6.7× at 64).
    assert doc["recommendation"] == "switch_to:sglang"
    doc16, _ = decide(tmp_path, SEED, "--slo", "e2e_p90=12s", "--load", "16")
    # A p90 needs 36 requests: at c=16 (32) not judged either; speed decides at 16.
    assert doc16["recommendation"] == "switch_to:sglang"
    assert "at c=16: sglang ahead, 2.5×" in doc16["action"]


def slo_text(doc: dict[str, Any]) -> str:
    return str(next(s for s in doc["decision"]["steps"] if s["key"] == "slo")["answer"])


def test_same_weights_ttft_slo_does_not_switch_on_the_warm_up_wave(tmp_path: Path) -> None:
    """SGLang's first round at c=16 had a slow wave (15 requests at 0.23 s TTFT): resampled
    as one block with its round (as the ratio intervals are), it is no confident miss, and
    llama.cpp meets the SLO nowhere with confidence, so the SLO switches nothing (it used to
    answer "switch to llama: sglang serves up to 4")."""
    args = ["decide", str(SAME), "--in-use", "sglang", "--slo", "ttft_p99=200ms"]
    for load in ([], ["--load", "16"]):
        out = tmp_path / f"sg{len(load)}"
        assert main([*args, *load, "--out", str(out)]) == 0
        doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
        assert doc["recommendation"] != "switch_to:llama", doc["action"]
        assert "only llama meets" not in doc["action"]
    text = slo_text(doc)
    assert "sglang meets it at no measured load" in text
    assert "c=16: misses" not in text
    assert "c=16: not judged (ttft_p99: 64 requests, a p99 needs 368)" in text
    assert "c=64: not judged (ttft_p99: 256 requests, a p99 needs 368)" in text
    assert "c=64: misses (ttft_p99 1.46 s" in text  # llama's


def test_same_weights_stay_alone_sglang_from_c16(tmp_path: Path) -> None:
    doc, _ = decide(tmp_path, SAME, "--load", "1")
    lv = levels(doc)
    # c=1: the whole request decides (llama 0.21 s, sglang 0.25 s), from 4 requests in 2
    # rounds a round apart by 17 %: not beyond what two rounds resolve. Decode is beside it.
    assert lv[1]["what"] == "end-to-end s per request" and lv[1]["winner"] is None
    assert lv[1]["beside"].startswith("decode 702 vs 603 tok/s, TTFT 0.0287 vs 0.0376 s")
    decode = next(s for s in doc["decision"]["steps"] if s["key"] == "decode")
    assert "llama ahead by +17 %" in decode["answer"]
    # c=4: sglang's rounds are 7 % and 18 % above llama's; two rounds resolve 10 % and the
    # interval of the ratio reaches below that: no difference beyond the noise.
    assert lv[4]["winner"] is None and lv[4]["ratio_lo"] < 1.10 < lv[4]["ratio_hi"]
    assert "with 2 rounds a difference under 10 % is not resolved" in lv[4]["basis"]
    assert [lv[c]["winner"] for c in (16, 64)] == ["sglang"] * 2
    # The crossover as a range: no difference at 4, sglang ahead at 16.
    assert (doc["decision"]["crossover_from"], doc["decision"]["crossover"]) == (4, 16)
    per_load = next(s for s in doc["decision"]["steps"] if s["key"] == "per_load")
    assert per_load["answer"].endswith("the answer changes between c=4 and c=16")
    # The lead is the quotient of the figures shown (6.70e3 / 2.78e3 and 9.32e3 / 2.50e3
    # tok/s: each round's tokens over its wall time); concurrency × Σ tokens / Σ e2e read
    # 2.5× and 3.8×.
    for c, lead in ((16, "2.4×"), (64, "3.7×")):
        assert f"{lv[c]['b'] / lv[c]['a']:.1f}×" == lead
        assert f"c={c}: sglang ahead ({lead} [" in per_load["answer"]
    assert doc["recommendation"] == "stay"
    assert doc["action"].startswith("stay on llama: no difference beyond the noise at c=1")
    doc64, _ = decide(tmp_path, SAME, "--load", "64")
    assert doc64["recommendation"] == "switch_to:sglang"


def test_a_load_between_levels_that_disagree_is_not_guessed(tmp_path: Path) -> None:
    doc, _ = decide(tmp_path, SAME, "--load", "8")
    assert doc["recommendation"] == "inconclusive"
    assert "measure at c=8" in doc["action"]


def test_the_output_folder_can_be_re_decided(tmp_path: Path) -> None:
    decide(tmp_path, SEED, "--load", "64")
    again = tmp_path / "again"
    assert main(["decide", str(tmp_path / "out0"), "--load", "64", "--out", str(again)]) == 0
    doc = json.loads((again / "results.json").read_text(encoding="utf-8"))
    # OUT's engine order is the one decided (llama in use): no --in-use needed any more.
    assert doc["recommendation"] == "switch_to:sglang"


def test_usage_errors(tmp_path: Path, capsys: Any) -> None:
    assert main(["decide", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "has no results.json" in capsys.readouterr().err
    args = ["decide", str(SEED), "--in-use", "vllm", "--out", str(tmp_path / "o")]
    assert main(args) == 2
    assert "the run measured sglang, llama" in capsys.readouterr().err
    assert main(["decide", str(SEED), "--slo", "ttft_p95=1s", "--out", str(tmp_path / "o")]) == 2
    assert main(["decide", str(SEED), "--out", str(SEED)]) == 2


def test_diagnose_folder_gets_the_largest_load_within_the_slo(tmp_path: Path) -> None:
    folder = ROOT / "docs" / "results" / "h200-answer-2026-11-30" / "diag"
    out = tmp_path / "diag"
    # A p50 is bounded from 6 requests (a p99 would need 368: not judged on this run).
    assert main(["decide", str(folder), "--slo", "ttft_p50=2s", "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    saved = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    assert doc["recommendation"] == saved["recommendation"]
    ((_, best),) = doc["decision"]["slo"]["max_within"].items()
    assert best is not None and best >= 1
    assert any(s["key"] == "slo" for s in doc["decision"]["steps"])


def test_the_slo_makes_a_new_decision_and_leaves_the_first_as_it_was() -> None:
    folder = ROOT / "docs" / "results" / "h200-answer-2026-11-30" / "diag"
    saved = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    engine = engine_from_dict(saved["engines"][0])
    first = decide_single(engine)
    steps = list(first.steps)
    judged = with_slo(first, engine, load_requests(folder, [engine]), parse_slo("ttft_p50=2s"))
    assert judged.slo is not None and judged.steps[-1].key == "slo"
    assert judged.steps[:-1] == steps
    assert first.slo is None and first.steps == steps
    with pytest.raises(FrozenInstanceError):
        first.slo = judged.slo  # type: ignore[misc]


H100_NP = ROOT / "docs" / "results" / "h100-issue32-33-2026-12-06" / "np1-np16"


def test_a_folder_saved_with_requests_xz_is_decided_from_its_requests(
    tmp_path: Path, capsys: Any
) -> None:
    """Saved runs keep requests.jsonl xz-compressed (the H100 np1-vs-np16 run): decide reads
    it, so the call has its intervals and c=1 the whole request, as on the day; OUT keeps
    the compressed file and can be decided again."""
    assert not (H100_NP / "requests.jsonl").exists() and (H100_NP / "requests.jsonl.xz").exists()
    out = tmp_path / "out"
    assert main(["decide", str(H100_NP), "--load", "16", "--out", str(out)]) == 0
    lv = levels(json.loads((out / "results.json").read_text(encoding="utf-8")))
    assert lv[1]["what"] == "end-to-end s per request"
    assert (
        lv[16]["lead"] == "2.0× [1.3–2.7]"
        and "bootstrap over 96 + 96 requests" in (lv[16]["basis"])
    )
    assert (out / "requests.jsonl.xz").is_file()
    again = tmp_path / "again"
    assert main(["decide", str(out), "--load", "16", "--out", str(again)]) == 0
    assert levels(json.loads((again / "results.json").read_text(encoding="utf-8")))[16]["lead"] == (
        "2.0× [1.3–2.7]"
    )
    # A damaged file is one message, exit 2, not a traceback.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.json").write_bytes((H100_NP / "results.json").read_bytes())
    (bad / "requests.jsonl.xz").write_bytes(b"not xz")
    capsys.readouterr()
    assert main(["decide", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "is not the requests diagnose wrote" in capsys.readouterr().err


def test_slo_figures_are_said_to_three_figures(tmp_path: Path) -> None:
    """A 20 ms SLO beside figures rounded to 10 ms read `misses (tpot_p90 0.02 s`: a miss
    by nothing. Below a second the figures are milliseconds to three figures."""
    doc, _ = decide(tmp_path, SAME, "--slo", "tpot_p90=20ms")
    text = doc["action"]
    assert "c=64: misses (tpot_p90 23.9 ms" in text  # llama's
    assert "c=16: meets (tpot_p90 1.54 ms" in text  # sglang's
    assert " 0.00 s" not in text and " 0.02 s" not in text


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"engines":', "not JSON (Expecting value, line 1)"),
        ("[1]", "it has no list of engines"),
        ('{"engines": {"a": 1}}', "it has no list of engines"),
        ('{"engines": [{"name": "a"}]}', "an engine or step does not read"),
        ('{"engines": [{"name": "a", "kind": "llamacpp", "rows": [{"zz": 1}]}]}', "'zz'"),
    ],
)
def test_a_results_json_that_is_not_one_says_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str
) -> None:
    """One line that names what does not read, exit 2 (it printed `'engines'` or `list
    indices must be integers or slices, not str` before)."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(text, encoding="utf-8")
    assert main(["decide", str(tmp_path / "run"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"llmb-loadgen: error: {tmp_path / 'run' / 'results.json'} is not a ")
    assert says in err and "\n" not in err, err
    assert not (tmp_path / "o").exists()
