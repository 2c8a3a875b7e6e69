"""Every surface that shows `card_throttled` or the card's state says it with core/card.py's
words (issue 32): the CLI answer and the report show `card_sentence`, the alert writes
`sentence` and the first cause's action as Go templates, the dashboard lists the causes'
actions, and the verdict's action is the held cause's (`EVIDENCE`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from config.settings import parse_config
from core import card, card_causes
from core.conditions import evaluate
from core.signals import Signals
from diagnose.answer import print_answer
from diagnose.decision.model import Prefill, Row
from diagnose.decision.one_engine import decide_single
from diagnose.decision.prefill import prefill_text, row_prefill
from diagnose.evidence import card_evidence, step_evidence
from diagnose.options import Options
from diagnose.phase_marks import PhasePublisher
from diagnose.procedure import Diagnoser
from diagnose.report.content import metadata_of, metadata_rows
from model.gpu_specs import table_peak_flops
from tests.paths import ROOT
from tests.unit.test_card_cause import FLOPS_PER_TOKEN, f16_scrapes, f16_values
from tests.unit.test_card_throttled import decide


def _diagnoser(tmp_path: Path) -> Diagnoser:
    cfg = parse_config(
        {"engines": [{"name": "e", "kind": "llamacpp", "url": "http://127.0.0.1:1"}]},
        environ={},
    )
    d = Diagnoser(cfg.engines[0], Options(), tmp_path, PhasePublisher())
    # The exporter's last scrape: the enforced limit the sentence names.
    limit = ("llmb_gpu_power_limit_watts", (("gpu", "0"), ("host", "h")))
    d.monitor.scrapes.append((1.0, {limit: 700.0}))
    return d


def test_the_answer_and_the_report_show_the_card_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The F16 H200 run: not the cause, and what the card did is beside the verdict."""
    sig = f16_values(tmp_path).signals
    expected = card.card_sentence(sig, 700.0)
    assert expected is not None and "at its stock 700 W power limit" in expected
    d = _diagnoser(tmp_path)
    # A load step's verdict: the result built at the run's end carries the card's sentence.
    d.step_verdicts.append(("concurrency", evaluate(sig).name, sig))
    res = d.result()
    assert res.verdict == evaluate(sig).name
    assert res.evidence["card"] == expected
    print_answer([res], decide_single(res), tmp_path)
    assert f"e: {expected}" in capsys.readouterr().out
    assert ("e: card", expected) in metadata_rows(metadata_of([res]))


def test_no_busy_sample_adds_no_card_line(tmp_path: Path) -> None:
    d = _diagnoser(tmp_path)
    assert card_evidence(d, Signals()) is None
    d.step_verdicts.append(("concurrency", "idle", Signals()))
    assert "card" not in d.result().evidence


def test_the_alert_says_the_core_sentence_and_every_cause_action() -> None:
    """The generated alerts.yml (`python -m mixin --check` keeps it current)."""
    doc = yaml.safe_load((ROOT / "prometheus" / "rules" / "alerts.yml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    (rule,) = [r for r in rules if r.get("alert") == "LLMCardThrottled"]
    text = rule["annotations"]["description"]
    # The sentence's own words around its clock, limit and explained share, in order.
    at = 0
    for part in card.sentence("\0", "\0", explained="\0", cause=True).split("\0"):
        at = text.index(part, at) + len(part)
    assert card.limit_words(None) in text
    assert card.limit_words("\0").split("\0")[0] in text
    for _, action in card_causes.cause_actions():
        assert action in text
    # First cause that holds wins, as the verdict's action: nested in EVIDENCE's order.
    positions = [text.index(action) for _, action in card_causes.cause_actions()]
    assert positions == sorted(positions)


def test_the_dashboard_lists_every_cause_action() -> None:
    doc = json.loads((ROOT / "grafana" / "dashboards" / "gpu-memory.json").read_text())

    def panels(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [q for p in items for q in [p, *panels(p.get("panels", []))]]

    (slowed,) = [p for p in panels(doc["panels"]) if p.get("title") == "Card slowed, per engine"]
    for label, action in card_causes.cause_actions():
        assert f"{label}: {action}" in slowed["description"]


@pytest.mark.parametrize(
    ("reading", "label"),
    [
        ("power-limit-lowered.json", "power_limit_lowered"),
        ("reason-hw_power_brake_slowdown.json", "power_brake"),
        ("reason-sw_thermal_slowdown.json", "thermal"),
        ("reason-sw_power_cap.json", "power"),
    ],
)
def test_the_verdict_action_is_the_held_cause(tmp_path: Path, reading: str, label: str) -> None:
    verdict, _ = decide(tmp_path, reading)
    assert verdict.name == "card_throttled" and verdict.evidence[0] == label
    assert verdict.action == dict(card_causes.cause_actions())[label]


def test_diagnose_takes_the_prefill_limit_at_the_clock_the_rules_take_it(
    tmp_path: Path,
) -> None:
    """One prefill efficiency (issue 32 item 3): the F16 H200 capture ran below its maximum
    SM clock; the rules take the compute peak at that clock (`clock_scaled_peak`), and the
    step's row, the verdict's signals and the answer line take the same limit."""
    values = f16_values(tmp_path)
    sig = values.signals
    assert sig.sm_clock_ratio is not None and sig.sm_clock_ratio < 0.99
    assert sig.prefill_efficiency is not None and values.prefill_tokens_per_second is not None
    scrapes = f16_scrapes(tmp_path)
    t0, t1 = scrapes[0][0], scrapes[-1][0]
    d = _diagnoser(tmp_path)
    d.monitor.scrapes[:] = scrapes
    d.monitor.exporter_engine = "llama"  # the capture's engine label
    d.facts = replace(
        d.facts,
        prefill=Prefill(
            peak_flops=table_peak_flops("NVIDIA H200")["bf16"], matmul_flops=FLOPS_PER_TOKEN
        ),
    )
    # The step's prompts as the engine timed them: the rules' figure over the same window.
    row = Row("e", "concurrency", 4, prompt_tokens=sig.prompt_tokens_mean,
              prefill_tok_s=values.prefill_tokens_per_second)  # fmt: skip
    row = replace(row, prefill_efficiency=row_prefill(d.facts, row).efficiency)  # as summed
    at_max = row.prefill_efficiency
    assert at_max is not None
    row = step_evidence(d, row, t0, t1)
    assert row.sm_clock_ratio == sig.sm_clock_ratio
    assert row.prefill_efficiency == pytest.approx(sig.prefill_efficiency, rel=1e-9)
    assert row.prefill_efficiency == pytest.approx(at_max / sig.sm_clock_ratio, rel=1e-9)
    ((_, _, step_sig),) = d.step_verdicts
    assert step_sig.prefill_efficiency == pytest.approx(sig.prefill_efficiency, rel=1e-9)
    assert step_sig.card_shortfall_explained == pytest.approx(
        sig.card_shortfall_explained, rel=1e-9
    )
    # The answer line names the clock the limit was taken at.
    text = prefill_text(row_prefill(d.facts, row))
    assert f"at the SM clock under load ({sig.sm_clock_ratio:.0%} of its maximum; 989.5 at" in text
