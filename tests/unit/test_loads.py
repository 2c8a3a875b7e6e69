"""diagnose.decision.loads: the answer per load, the crossover, the user's load, the veto of
long context and the SLO's say (typed inputs, no measurement)."""

from __future__ import annotations

from core.slo import StepSlo
from diagnose.decision.loads import (
    LoadAnswer,
    answer_at,
    crossover,
    crossover_range,
    per_load_text,
    recommend,
)
from diagnose.decision.model import EngineResult, SloAnswer, switch_to


def lv(c: int, winner: str | None) -> LoadAnswer:
    return LoadAnswer(c, "aggregate tok/s", winner, "2.0× [1.8–2.2]" if winner else "", 100, 200,
                      "bootstrap", 1.8, 2.2)  # fmt: skip


A = EngineResult("llama", "llamacpp", action="Tune the engine.")
B = EngineResult("sglang", "sglang")
LEVELS = [lv(1, "llama"), lv(4, "sglang"), lv(16, "sglang"), lv(64, "sglang")]


def test_the_crossover_is_a_range_and_no_difference_is_an_answer() -> None:
    assert crossover_range(LEVELS) == (1, 4) and crossover(LEVELS) == 4
    # A level with no difference is not skipped: the answer changes after it.
    assert crossover_range([lv(1, "llama"), lv(4, None), lv(16, "sglang")]) == (4, 16)
    assert crossover_range([lv(1, None), lv(4, None), lv(16, "sglang")]) == (4, 16)
    # The engine ahead at the first level ahead again after a tie: nothing crossed.
    assert crossover_range([lv(1, "llama"), lv(4, None), lv(16, "llama")]) is None
    assert crossover_range([lv(1, None), lv(4, None)]) is None


def test_per_load_text_gives_every_level_its_ratio() -> None:
    levels = [lv(1, "llama"), lv(4, None), lv(16, "sglang"), lv(64, "sglang")]
    levels[3].lead = "6.7× [6.4–7.1]"
    text = per_load_text(levels)
    assert text.startswith("c=1: llama ahead (2.0× [1.8–2.2] aggregate tok/s); c=4: no difference")
    assert "c=16: sglang ahead (2.0× [1.8–2.2] aggregate tok/s)" in text
    assert text.endswith("c=64: sglang ahead (6.7× [6.4–7.1] aggregate tok/s)")


def test_a_load_between_two_levels_names_both_and_their_ratios() -> None:
    levels = [lv(16, "sglang"), lv(64, "sglang")]
    levels[0].lead, levels[1].lead = "2.5× [2.2–2.8]", "6.7× [6.4–7.1]"
    rec, action = recommend(A, B, levels, None, 32, None)
    assert rec == switch_to("sglang")
    assert action.startswith(
        "switch to sglang: at c=32 (between c=16: sglang ahead 2.5× [2.2–2.8] and c=64: "
        "sglang ahead 6.7× [6.4–7.1], which agree): sglang ahead, aggregate tok/s at both"
    ), action


def test_answer_at_a_load_between_levels() -> None:
    assert answer_at(LEVELS, 16)[0] is LEVELS[2]
    assert answer_at(LEVELS, 8)[0] is LEVELS[2]  # 4 and 16 agree
    found, why = answer_at(LEVELS, 2)
    assert found is None and "measure at c=2" in why
    assert answer_at(LEVELS, 512)[0] is LEVELS[-1]


def test_switch_only_when_ahead_at_the_load_and_long_context_holds() -> None:
    assert recommend(A, B, LEVELS, None, 64, None)[0] == switch_to("sglang")
    rec, action = recommend(A, B, LEVELS, None, 1, None)
    assert rec == "stay_and_tune" and action.startswith("stay on llama and tune: at c=1")
    # SGLang is ahead at 64, but its memory gives out first at long context: stay.
    rec, action = recommend(A, B, LEVELS, "llama", 64, None)
    assert rec == "stay_and_tune" and "memory gives out first" in action


def step(c: int, met: bool) -> StepSlo:
    return StepSlo(c, met, 8, 8 if met else 0, 1.0 if met else 0.0, 1.0, 96.0, {"e2e_p99": 1.0})


def test_the_slo_decides_before_speed() -> None:
    slo = SloAnswer(
        "e2e_p99=5s",
        {"llama": [step(1, True), step(4, True), step(16, False)],
         "sglang": [step(1, True), step(4, True), step(16, True)]},
        {"llama": 4, "sglang": 16},
    )  # fmt: skip
    # Speed says llama at 1; the SLO says only sglang holds at 16.
    assert recommend(A, B, LEVELS, None, 16, slo)[0] == switch_to("sglang")
    # Both meet it at 4: speed decides there.
    assert recommend(A, B, [lv(4, "llama")], None, 4, slo)[0] == "stay_and_tune"
    rec, action = recommend(A, B, LEVELS, None, None, slo)
    assert rec == switch_to("sglang") and "sglang serves up to 16" in action


def test_a_level_too_small_to_call_says_not_decided() -> None:
    from diagnose.decision.calls import AGGREGATE, Call
    from diagnose.decision.loads import level_answers

    one_round = Call(AGGREGATE, 1, 47.9, 43.0, None, None, basis="one round: nothing called",
                     decidable=False)  # fmt: skip
    (level,) = level_answers([one_round])
    assert per_load_text([level]).startswith("c=1: not decided (aggregate tok/s 47.9 vs 43")
