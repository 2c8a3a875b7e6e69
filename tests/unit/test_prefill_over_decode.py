"""When long prompts take most of the time, a prefill verdict, not `decode_at_card_limit`
(issue 32 item 6: a 16-bit 27B shape with 8192-token prompts gives a prefill verdict).

The real case: the F16 Gemma-3-27B-shape run on an H100 (docs/results/h100-issue32-33.md,
`llmb-loadgen diagnose` on a CUDA llama-server, 8192-token prompts at c=1 and c=4, 64 output
tokens). Decode ran at 73 % of the bandwidth roofline, so the decision said
`decode_at_card_limit` ("another engine gains little on decode"); but prompts took 52 % of the
prompt + decode seconds at 29 % of the compute peak: prefill, not decode, set the speed, and
only the prefill verdict points at what can be gained. Decode at the limit still holds where
decode takes the time, where prompts are short, or where no time share is measured.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from core.conditions import evaluate
from core.signals import Signals
from diagnose.decide import redecide
from diagnose.decision.two_engines import CompareInputs
from tests.paths import ROOT

RUN = ROOT / "docs" / "results" / "h100-issue32-33-2026-12-06" / "f16-prefill"


def saved_signals() -> Signals:
    doc = json.loads((RUN / "results.json").read_text(encoding="utf-8"))
    known = {f.name for f in dataclasses.fields(Signals)}
    return Signals(**{k: v for k, v in doc["engines"][0]["signals"].items() if k in known})


def test_the_saved_f16_run_is_a_prefill_verdict_not_decode_or_card() -> None:
    sig = saved_signals()
    # What the card measured: decode at its limit, prompts long and most of the time.
    assert sig.decode_efficiency == pytest.approx(0.731, abs=0.001)
    assert sig.prefill_time_share == pytest.approx(0.516, abs=0.001)
    assert sig.prefill_efficiency == pytest.approx(0.288, abs=0.001)
    assert evaluate(sig).name == "prefill_below_card_limit"
    engines, _ = redecide(RUN, None, CompareInputs())
    assert [e.verdict for e in engines] == ["prefill_below_card_limit"]
    assert engines[0].action is not None and "Tune prefill" in engines[0].action


@pytest.mark.parametrize(
    ("change", "verdict"),
    [
        ({}, "prefill_below_card_limit"),
        # Decode takes most of the time: the card is the limit for decode.
        ({"prefill_time_share": 0.3}, "decode_at_card_limit"),
        # No time share measured: decode's own evidence stands.
        ({"prefill_time_share": None}, "decode_at_card_limit"),
        # Short prompts: no prefill verdict can hold, whatever the share.
        ({"prompt_tokens_mean": 200.0, "prefill_time_share": 0.9}, "decode_at_card_limit"),
        # Prefill at the compute limit with little waiting comes first, as before.
        ({"prefill_efficiency": 0.7}, "prefill_at_card_limit"),
    ],
)
def test_decode_at_the_limit_yields_to_prefill_only_when_prompts_take_the_time(
    change: dict[str, float | None], verdict: str
) -> None:
    assert evaluate(dataclasses.replace(saved_signals(), **change)).name == verdict
