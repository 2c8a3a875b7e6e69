"""The length-mix file (`llmb-length-mix`): read, written back, sampled, and refused clearly."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from loadgen.traffic.mix import LengthDist, LengthMix, MixError
from loadgen.traffic.spec import load_traffic
from tests.plugins.loadgen import sample_served_mix

MIX = {
    "kind": "llmb-length-mix",
    "version": 1,
    "prompt_tokens": {"empirical": [[100, 1], [300, 3], [1000, 0]]},
    "output_tokens": {"lognormal": [4.0, 0.5]},
    "rate_per_second": 2.5,
    "concurrency": None,
    "seed": 7,
    "requests": 50,
    "source": "test",
}


def test_a_mix_round_trips_through_its_json() -> None:
    mix = LengthMix.from_json(json.dumps(MIX))
    assert json.loads(mix.to_json()) == MIX
    assert LengthMix.from_json(mix.to_json()) == mix


def test_empirical_draws_stay_in_their_buckets_by_weight() -> None:
    dist = LengthMix.from_json(json.dumps(MIX)).prompt_tokens
    rng = random.Random(1)
    draws = [dist.sample(rng) for _ in range(4000)]
    assert min(draws) >= 1 and max(draws) <= 300  # the 0-weight bucket is never drawn
    low = sum(1 for d in draws if d <= 100) / len(draws)
    assert 0.22 < low < 0.28  # weight 1 of 4
    assert any(100 < d <= 300 for d in draws)
    assert dist.mean() == pytest.approx((50 * 1 + 200 * 3) / 4)


@pytest.mark.parametrize(
    ("shape", "mean"),
    [({"fixed": 64}, 64), ({"uniform": [10, 30]}, 20), ({"normal": [500, 50]}, 500)],
)
def test_each_shape_draws_around_its_mean(shape: dict, mean: float) -> None:
    dist = LengthDist.model_validate(shape)
    rng = random.Random(3)
    draws = [dist.sample(rng) for _ in range(3000)]
    assert sum(draws) / len(draws) == pytest.approx(mean, rel=0.03)
    assert all(isinstance(d, int) and d >= 1 for d in draws)


def test_lognormal_median_is_exp_mu() -> None:
    dist = LengthDist.model_validate({"lognormal": [6.0, 0.8]})
    rng = random.Random(5)
    draws = sorted(dist.sample(rng) for _ in range(4001))
    assert draws[2000] == pytest.approx(403, rel=0.06)  # e**6


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"extra": 1}, "extra: Extra inputs are not permitted"),
        ({"kind": "other"}, "kind:"),
        ({"version": 2}, "version:"),
        ({"prompt_tokens": {"fixed": 1, "uniform": [1, 2]}}, "exactly one of"),
        ({"prompt_tokens": {"gamma": [1, 2]}}, "prompt_tokens.gamma"),
        ({"prompt_tokens": {"empirical": [[10, 1], [5, 1]]}}, "strictly increasing"),
        ({"prompt_tokens": {"empirical": [[10, 0]]}}, "sum to 0"),
        ({"prompt_tokens": {"uniform": [5, 2]}}, "lo <= hi"),
        ({"output_tokens": {"fixed": 0}}, "output_tokens.fixed"),
        ({"rate_per_second": 0}, "rate_per_second"),
    ],
)
def test_a_bad_mix_names_its_field(change: dict, words: str) -> None:
    with pytest.raises(MixError, match=words.replace("(", r"\(")):
        LengthMix.from_json(json.dumps(MIX | change))


def test_not_json_is_a_mix_error() -> None:
    with pytest.raises(MixError, match="Invalid JSON"):
        LengthMix.from_json("{not json")


def test_the_served_mix_file_is_what_traffic_reads(tmp_path: Path) -> None:
    """`served-mix`'s file (loadgen/served_mix.py) reads back as a LengthMix and replays."""
    served = sample_served_mix(rate_per_second=2.0)
    mix = LengthMix.from_json(served.length_mix().to_json())
    assert mix.prompt_tokens.empirical == ((100, 4.0), (300, 3.0)) and mix.output_tokens.fixed == 30
    path = tmp_path / "served-mix.json"
    path.write_text(served.length_mix().to_json())
    traffic = load_traffic(str(path), requests=40)
    assert len(traffic.requests) == 40 and traffic.scheduled and traffic.concurrency == 2
    assert all(1 <= r.prompt_tokens <= 300 and r.output_tokens == 30 for r in traffic.requests)
