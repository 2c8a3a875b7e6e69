"""The short form of the switch-noise simulation (diagnose/switch_noise.py, the table of
docs/diagnose.md): compare's own call on synthetic request records with round, wave and
request noise. Identical engines must not switch in more than 1 run of 40 at --rounds 3, and
an engine 30 % faster must be called in at least 38 of 40."""

from __future__ import annotations

from core.stats import resolvable
from core.thresholds import COMPARE_NOISE_FLOOR, RESOLVABLE_DIFFERENCE
from diagnose.switch_noise import Noise, outcome

NOISE = Noise(round=0.03, wave=0.03, request=0.10)


def test_identical_engines_switch_in_at_most_1_of_40_runs_at_3_rounds() -> None:
    got = outcome(0.0, rounds=3, runs=40, noise=NOISE)
    assert got.switch <= 1 and got.called <= 2, got


def test_a_30_percent_faster_engine_switches_in_at_least_38_of_40_runs_at_3_rounds() -> None:
    got = outcome(0.30, rounds=3, runs=40, noise=NOISE)
    assert got.switch >= 38 and got.stay_ahead == 0, got


def test_one_round_calls_no_difference_below_what_it_can_resolve() -> None:
    assert resolvable(3) == resolvable(5) == COMPARE_NOISE_FLOOR
    assert resolvable(1) == RESOLVABLE_DIFFERENCE[1] > resolvable(2) > COMPARE_NOISE_FLOOR
    # 10 % apart with no noise at all: one round does not call it, three rounds do.
    quiet = Noise(round=0.0, wave=0.0, request=0.01)
    assert outcome(0.10, rounds=1, runs=3, noise=quiet).called == 0
    assert outcome(0.10, rounds=3, runs=3, noise=quiet).switch == 3
